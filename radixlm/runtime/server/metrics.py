"""Prometheus metrics of the server (prometheus-client, a private registry per server process).

Runs in the HTTP process. Counters and latency histograms are updated by the tokenizer manager as
outputs arrive; the running/queued/KV gauges come from the scheduler's heartbeat.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixlm.runtime.messages import Heartbeat, RequestError

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "radixlm_"
        self.requests = Counter(p + "requests", "Finished generation requests", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter(p + "cached_tokens", "Prompt tokens served from the prefix cache",
                                     registry=r)
        self.cache_hit_rate = Gauge(p + "cache_hit_rate", "cached_tokens / prompt_tokens so far", registry=r)
        self.num_running = Gauge(p + "num_running_reqs", "Requests in the running batch", registry=r)
        self.num_queued = Gauge(p + "num_queued_reqs", "Requests waiting in the scheduler", registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage", "Share of KV slots not free (incl. cached)", registry=r)
        self.kv_cached = Gauge(p + "kv_cache_cached_tokens", "Tokens held by the radix cache", registry=r)
        # robustness.md invariant 1 as gauges: when idle, free + evictable == total and locked == 0.
        self.kv_free = Gauge(p + "kv_free_tokens", "Free KV slots", registry=r)
        self.kv_evictable = Gauge(p + "kv_evictable_tokens", "Cached KV slots that can be evicted", registry=r)
        self.kv_locked = Gauge(p + "kv_locked_tokens", "Cached KV slots locked by running requests", registry=r)
        self.kv_total = Gauge(p + "kv_total_tokens", "KV pool capacity in tokens", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between output tokens",
                             buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "End-to-end request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.grammar_compile = Histogram(p + "grammar_compile_seconds", "Grammar compile wall time (workers)",
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.spec_proposed = Counter(p + "spec_proposed_tokens", "Speculative draft tokens verified", registry=r)
        self.spec_accepted = Counter(p + "spec_accepted_tokens", "Speculative draft tokens accepted", registry=r)
        self.spec_acceptance = Gauge(p + "spec_acceptance_rate", "spec accepted / proposed tokens so far",
                                     registry=r)
        self._prompt_total = 0
        self._spec_totals = [0, 0]  # proposed, accepted
        self._cached_total = 0

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_tokens(self, num_tokens: int, seconds_since_last: float) -> None:
        # One step may bring several tokens (jump-forward); spread the gap evenly over them.
        for _ in range(num_tokens):
            self.itl.observe(seconds_since_last / num_tokens)

    def on_finish(self, meta: dict, e2e_seconds: float, error: RequestError | None = None) -> None:
        finish = meta.get("finish_reason") or {}
        # A request refused for the client's mistake (a grammar that does not compile, ...) ends as an
        # abort inside; it is counted apart, so aborts stay aborts (disconnects, abort_request, drain).
        client_fault = error is not None and 400 <= error.status < 500
        self.requests.labels("invalid_request" if client_fault else finish.get("type", "unknown")).inc()
        prompt, cached = int(meta.get("prompt_tokens", 0)), int(meta.get("cached_tokens", 0))
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        self.generation_tokens.inc(int(meta.get("completion_tokens", 0)))
        self._prompt_total += prompt
        self._cached_total += cached
        self.cache_hit_rate.set(self._cached_total / self._prompt_total if self._prompt_total else 0.0)
        self.e2e.observe(e2e_seconds)
        proposed = int(meta.get("spec_proposed_tokens", 0))
        if proposed:
            accepted = int(meta.get("spec_accepted_tokens", 0))
            self.spec_proposed.inc(proposed)
            self.spec_accepted.inc(accepted)
            self._spec_totals[0] += proposed
            self._spec_totals[1] += accepted
            self.spec_acceptance.set(self._spec_totals[1] / self._spec_totals[0])

    def on_heartbeat(self, hb: Heartbeat) -> None:
        self.num_running.set(hb.num_running)
        self.num_queued.set(hb.num_waiting)
        total = max(1, hb.num_total_tokens)
        self.kv_usage.set((total - hb.num_free_tokens) / total)
        self.kv_cached.set(hb.num_cached_tokens)
        self.kv_free.set(hb.num_free_tokens)
        self.kv_evictable.set(hb.num_evictable_tokens)
        self.kv_locked.set(hb.num_locked_tokens)
        self.kv_total.set(hb.num_total_tokens)
        for seconds in hb.grammar_compile_seconds:
            self.grammar_compile.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
