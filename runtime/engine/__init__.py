"""Continuous batching over one bundle's cache rows.

`engine.Engine` runs the loop: it plans with a pure-Python `scheduler.Scheduler` (torch-free, so this
package imports nothing itself) and carries each plan out with a `runner.Runner` over the KV cache, the
prefill and a decode backend. Each request has one `request.RequestState`, seen by its caller through
a `handle.Handle`; `status` holds its status and finish reasons.
"""
