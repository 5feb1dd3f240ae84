"""The generate() call around the engine: validating what it asks for (`validate`, `options`) and
returning what HF's `generate` returns (`outputs`)."""
