"""What the dashboard remembers between scheduler snapshots: request timelines and rates over time.

Runs in the HTTP process, on the event loop. `RequestLog` and `RateLog` are fed by the tokenizer manager
for every output (first token, tokens, finish: exact times, no sampling) and by each scheduler snapshot
(the phase a request is in: grammar / queued / prefill / decode, retractions, jump-forward: sampled at the
snapshot rate). Times are time.perf_counter() seconds of this process (RequestHandle.start's clock).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

MAX_FINISHED = 40  # finished requests kept for the timeline
RATE_BUCKETS = 180  # one per second: three minutes of rates
PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    rid: str
    ns: str  # raw namespace (made opaque when a view is built)
    t0: float  # submitted (RequestHandle.start)
    t_first: float | None = None  # first output token
    t_end: float | None = None
    finish: dict[str, Any] | None = None
    prompt: int = 0
    cached: int = 0
    out: int = 0
    phases: list[tuple[str, float]] = field(default_factory=list)  # (state, first seen) from snapshots
    marks: list[tuple[str, float]] = field(default_factory=list)  # ("retraction" | "jump_forward", time)
    retractions: int = 0
    jump_forward: int = 0

    def observe(self, view: dict[str, Any], now: float) -> None:
        """One scheduler snapshot's view of this request."""
        if not self.phases or self.phases[-1][0] != view["state"]:
            self.phases.append((view["state"], now))
        if view["retractions"] > self.retractions:
            self.marks.append(("retraction", now))
        if view["jump_forward"] > self.jump_forward:
            self.marks.append(("jump_forward", now))
        self.retractions, self.jump_forward = view["retractions"], view["jump_forward"]
        self.prompt, self.cached, self.out = view["prompt"], view["cached"], max(self.out, view["out"])

    def segments(self, now: float) -> list[tuple[str, float, float]]:
        """(phase, start, end) bars: grammar compile, queued, prefill (until the first token), decode."""
        end = self.t_end if self.t_end is not None else now
        seen = {state: t for state, t in reversed(self.phases)}  # the first time each state was seen
        # Admission: first seen running; a request no snapshot saw before its first token counts as prefill
        # from submission (its queue time could not be told apart).
        running = min([t for s, t in self.phases if s in ("prefill", "decode")] + [self.t_first or end, end])
        if not self.phases:
            running = self.t0
        segs: list[tuple[str, float, float]] = []
        start = self.t0
        if "grammar" in seen:
            grammar_end = min([t for s, t in self.phases if s != "grammar"] + [running])
            segs.append(("grammar", start, grammar_end))
            start = grammar_end
        if running > start:
            segs.append(("queued", start, running))
        first = self.t_first if self.t_first is not None else end
        if first > running:
            segs.append(("prefill", running, first))
        if self.t_first is not None and end > self.t_first:
            segs.append(("decode", self.t_first, end))
        return segs


class RequestLog:
    def __init__(self) -> None:
        self.live: dict[str, RequestRecord] = {}
        self.finished: OrderedDict[str, RequestRecord] = OrderedDict()

    def record(self, rid: str, ns: str, t0: float) -> RequestRecord | None:
        """The live record of rid (created on first sight); None once it has finished."""
        if rid in self.finished:
            return None
        rec = self.live.get(rid)
        if rec is None:
            rec = self.live[rid] = RequestRecord(rid, ns, t0)
        return rec

    def on_output(self, rid: str, ns: str, t0: float, now: float, num_new_tokens: int,
                  meta: dict[str, Any] | None, finished: bool) -> None:
        rec = self.record(rid, ns, t0)
        if rec is None:
            return
        if num_new_tokens and rec.t_first is None:
            rec.t_first = now
        rec.out += num_new_tokens
        if not finished:
            return
        rec.t_end = now
        meta = meta or {}
        rec.finish = meta.get("finish_reason")
        rec.prompt = int(meta.get("prompt_tokens", rec.prompt))
        rec.cached = int(meta.get("cached_tokens", rec.cached))
        rec.out = int(meta.get("completion_tokens", rec.out))
        self.finished[rid] = self.live.pop(rid)
        while len(self.finished) > MAX_FINISHED:
            self.finished.popitem(last=False)

    def observe(self, views: list[dict[str, Any]], starts: dict[str, float], now: float) -> None:
        """A snapshot's requests; `starts`: rid -> submit time of the requests the server has in flight
        (a rid the server no longer knows is finishing: not recreated)."""
        for view in views:
            if view["rid"] in starts:
                rec = self.record(view["rid"], view["ns"], starts[view["rid"]])
                if rec is not None:
                    rec.observe(view, now)
        for rid in [r for r in self.live if r not in starts]:  # gone without a final output (server failure)
            del self.live[rid]


@dataclass
class _Bucket:
    tokens: int = 0
    prompt: int = 0
    cached: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)


class RateLog:
    """Per-second buckets of generated tokens, prompt / cached tokens (finished requests), TTFT and ITL."""

    def __init__(self) -> None:
        self.buckets: OrderedDict[int, _Bucket] = OrderedDict()

    def _bucket(self, now: float) -> _Bucket:
        key = int(now)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = _Bucket()
            while len(self.buckets) > RATE_BUCKETS:
                self.buckets.popitem(last=False)
        return bucket

    def on_tokens(self, now: float, num: int, ttft: float | None, gap: float | None) -> None:
        bucket = self._bucket(now)
        bucket.tokens += num
        if ttft is not None:
            bucket.ttft.append(ttft)
        if gap is not None and num:
            bucket.itl.extend([gap / num] * min(num, 64))

    def on_finish(self, now: float, prompt: int, cached: int) -> None:
        bucket = self._bucket(now)
        bucket.prompt += prompt
        bucket.cached += cached

    def view(self, now: float, window_s: int = 120) -> dict[str, Any]:
        """Series (one point per second that saw traffic) and percentiles over the last minute."""
        series, ttft, itl, tokens, prompt, cached = [], [], [], 0, 0, 0
        for key, b in self.buckets.items():
            if key < now - window_s:
                continue
            series.append({"t": key, "tok_s": b.tokens, "hit_rate": b.cached / b.prompt if b.prompt else None,
                           "ttft_p50": _pct(b.ttft, 50), "itl_p50": _pct(b.itl, 50), "itl_p99": _pct(b.itl, 99)})
            if key >= now - 60:
                ttft += b.ttft
                itl += b.itl
                tokens, prompt, cached = tokens + b.tokens, prompt + b.prompt, cached + b.cached
        summary = {"tok_s_60s": tokens / 60, "hit_rate_60s": cached / prompt if prompt else None,
                   **{f"ttft_p{p}": _pct(ttft, p) for p in PERCENTILES},
                   **{f"itl_p{p}": _pct(itl, p) for p in PERCENTILES}}
        return {"series": series, "summary": summary}


def _pct(values: list[float], p: int) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class PoolHistory:
    def __init__(self, maxlen: int = 600) -> None:
        self.points: deque[list[float]] = deque(maxlen=maxlen)  # [t, used, evictable, free, locked, retractions]

    def add(self, now: float, pool: dict[str, int], retractions: int) -> None:
        self.points.append([round(now, 3), pool["used"], pool["evictable"], pool["free"], pool["locked"],
                            retractions])
