"""Prometheus metrics of one server, in a registry of its own (two apps in one process stay apart).

Owns: requests by endpoint and status, prompt and generated tokens, prefix-cache hits and the prompt
tokens they skipped, speculative decoding's drafted and accepted tokens and verify steps, queue depth
and cache rows in use (read from the engine when scraped), and histograms of time to first token and inter-token latency
(from the engine's own token times, runtime.engine.request).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self, engine, rows: int):
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "aotpack_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("aotpack_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generated_tokens = Counter("aotpack_generated_tokens", "tokens generated", registry=r)
        self.cache_hits = Counter(
            "aotpack_prefix_cache_hits", "requests that found part of their prompt in the cache", registry=r
        )
        self.cached_tokens = Counter(
            "aotpack_prefix_cache_tokens", "prompt tokens found in the cache, not prefilled", registry=r
        )
        r.register(_Speculation(engine))
        queue = Gauge("aotpack_queue_depth", "requests waiting for cache rows", registry=r)
        queue.set_function(lambda: engine.load[1])
        in_use = Gauge("aotpack_slots_in_use", "cache rows held by requests", registry=r)
        in_use.set_function(lambda: engine.rows_in_use)
        Gauge("aotpack_slots", "cache rows of the bundle", registry=r).set(rows)
        self.ttft = Histogram(
            "aotpack_time_to_first_token_seconds", "submit to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "aotpack_inter_token_latency_seconds", "gap between a request's tokens", buckets=LATENCY_BUCKETS, registry=r
        )

    def finished(self, handle, prompt_tokens: int) -> None:
        """Record a request's tokens and latencies once it has ended."""
        times = handle.times
        self.prompt_tokens.inc(prompt_tokens)
        if cached := handle.cached_tokens:
            self.cache_hits.inc()
            self.cached_tokens.inc(cached)
        self.generated_tokens.inc(len(times))
        if times:
            self.ttft.observe(times[0] - handle.submitted)
        for a, b in zip(times, times[1:], strict=False):
            self.itl.observe(b - a)

    def served(self) -> int:
        """API requests answered so far, whatever their status."""
        return int(
            sum(
                sample.value
                for metric in self.requests.collect()
                for sample in metric.samples
                if sample.name.endswith("_total")
            )
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Speculation(Collector):
    """Speculative decoding's totals, read from the engine when scraped: drafted and accepted tokens (their
    ratio is the acceptance rate) and verify steps."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        e = self.engine
        for name, what, value in (
            ("aotpack_spec_drafted_tokens", "tokens drafted by prompt lookup", e.drafted),
            ("aotpack_spec_accepted_tokens", "drafted tokens the model accepted", e.accepted),
            ("aotpack_spec_verify_steps", "verify steps (each also gives its rows' next token)", e.verify_steps),
        ):
            yield CounterMetricFamily(name, what, value=value)
