"""`aotpack serve`: an OpenAI-compatible HTTP server over one loaded bundle (extra `aotpack[serve]`).

Owns nothing itself; its modules are: `config` (the frozen options), `schema` (OpenAI request bodies),
`messages` (chat messages and images to model inputs), `completion` (one request through the engine,
as text with OpenAI's stop and finish rules), `metrics` (Prometheus), `app` (the FastAPI routes,
errors and limits), `server` (uvicorn, start-up line, SIGTERM) and `cluster` (`--ray`: the same app
in every replica of a Ray Serve deployment; extra `aotpack[ray]`).
"""
