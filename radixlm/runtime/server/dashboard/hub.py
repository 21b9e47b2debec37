"""DashboardHub: asks the scheduler(s) for snapshots while someone is looking, and builds the page's view.

Runs in the HTTP process, on the event loop. The scheduler is asked only when a view is requested (the
JSON endpoint or an open event stream), at most once per `min_interval_s` however many viewers there are;
the scheduler rate-limits its side too (scheduler/dashboard.py). The tokenizer manager feeds every output
to `on_output` (cheap: a few dict updates), so rates and finished requests are known without polling.

What leaves this module for a browser: namespaces as opaque ids (a salted hash, the salt new each server
start, so an id cannot be matched to a key), and token text only in the admin key's view.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from radixlm.runtime.server.context import off_loop
from radixlm.runtime.server.dashboard.timeline import PoolHistory, RateLog, RequestLog, RequestRecord

if TYPE_CHECKING:
    from radixlm.runtime.messages import StrOut
    from radixlm.runtime.server.tokenizer_manager import RequestHandle, TokenizerManager

MIN_INTERVAL_S = 0.5  # the page's refresh rate: scheduler snapshots at most twice a second
MAX_TEXT_CACHE = 4096  # decoded node texts kept (admin view)


class DashboardHub:
    def __init__(self, tm: "TokenizerManager", min_interval_s: float = MIN_INTERVAL_S):
        self.tm = tm
        self.min_interval_s = min_interval_s
        self.salt = os.urandom(16)
        self.requests = RequestLog()
        self.rates = RateLog()
        self.pool = PoolHistory()
        self._raw: list[dict[str, Any] | None] = []
        self._at = float("-inf")
        self._lock = asyncio.Lock()
        self._texts: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        self.num_snapshots = 0

    # ---- fed by the tokenizer manager ---------------------------------------------------------------
    def on_output(self, out: "StrOut", handle: "RequestHandle", now: float) -> None:
        """Every StrOut, before the tokenizer manager records it (handle.last_token_at is the previous token)."""
        prev = handle.last_token_at.get(out.rid)
        if out.num_new_tokens:
            self.rates.on_tokens(now, out.num_new_tokens, now - handle.start if prev is None else None,
                                 None if prev is None else now - prev)
        meta = out.payload.get("meta_info") if isinstance(out.payload, dict) else None
        self.requests.on_output(out.rid, handle.namespace, handle.start, now, out.num_new_tokens, meta, out.finished)
        if out.finished and meta and out.error is None:
            self.rates.on_finish(now, int(meta.get("prompt_tokens", 0)), int(meta.get("cached_tokens", 0)))

    # ---- snapshots ----------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """A new scheduler snapshot unless the last one is younger than min_interval_s."""
        async with self._lock:
            if time.perf_counter() - self._at < self.min_interval_s:
                return
            resps = await self.tm.control_ranks("dashboard_snapshot", timeout=30.0)
            now = time.perf_counter()
            self._raw = [r.data if r.ok else None for r in resps]
            self._at = now
            self.num_snapshots += 1
            starts = {rid: h.start for rid, h in self.tm.handles.items()}
            ranks = [d for d in self._raw if d]
            self.requests.observe([r for d in ranks for r in d["requests"]], starts, now)
            pool = {k: sum(d["pool"][k] for d in ranks) for k in ("total", "free", "evictable", "locked", "used")}
            self.pool.add(now, pool, sum(d["counters"]["num_retractions"] for d in ranks))

    def opaque(self, namespace: str) -> str:
        if namespace == "":
            return "default"
        return "ns-" + hashlib.sha256(self.salt + namespace.encode()).hexdigest()[:8]

    async def view(self, is_admin: bool) -> dict[str, Any]:
        """The page's JSON (after refresh()). Times are seconds relative to now (negative: the past)."""
        now = time.perf_counter()
        ranks = [(i, d) for i, d in enumerate(self._raw) if d]
        nodes = [self._node(rank, n) for rank, d in ranks for n in d["tree"]["nodes"]]
        if is_admin:
            await self._add_texts(nodes, [n for _, d in ranks for n in d["tree"]["nodes"]])
        pool = {k: sum(d["pool"][k] for _, d in ranks) for k in ("total", "free", "evictable", "locked", "used")}
        counters: dict[str, float] = {}
        for _, d in ranks:
            for key, value in d["counters"].items():
                counters[key] = counters.get(key, 0) + value
        counters["hit_rate"] = counters["cached_tokens"] / counters["prompt_tokens"] if counters.get(
            "prompt_tokens") else 0.0
        return {
            "is_admin": is_admin, "dp_size": len(self._raw), "snapshot_age_s": round(now - self._at, 3),
            "build_ms": max((d.get("build_ms", 0.0) for _, d in ranks), default=0.0),
            "pool": pool, "counters": counters,
            "pool_history": [[round(p[0] - now, 3), *p[1:]] for p in self.pool.points],
            "tree": {"nodes": nodes, "num_nodes": sum(d["tree"]["num_nodes"] for _, d in ranks),
                     "folded_at_root": sum(d["tree"]["folded_at_root"] for _, d in ranks)},
            "requests": [self._request(r, now) for r in [*self.requests.live.values(),
                                                          *reversed(self.requests.finished.values())]],
            "rates": self._rates(now),
        }

    def _node(self, rank: int, n: dict[str, Any]) -> dict[str, Any]:
        view = {k: v for k, v in n.items() if k not in ("tokens", "ns", "id", "parent")}
        view["id"] = f"{rank}.{n['id']}"
        view["parent"] = None if n["parent"] == -1 else f"{rank}.{n['parent']}"
        view["ns"] = self.opaque(n["ns"])
        view["rank"] = rank
        return view

    async def _add_texts(self, views: list[dict[str, Any]], raw: list[dict[str, Any]]) -> None:
        missing = [(v, n) for v, n in zip(views, raw) if (v["rank"], n["id"], n["len"]) not in self._texts]
        if missing:
            texts = await off_loop(self.tm.tokenizer.batch_decode, [n["tokens"] for _, n in missing])
            for (v, n), text in zip(missing, texts):
                self._texts[(v["rank"], n["id"], n["len"])] = text
            while len(self._texts) > MAX_TEXT_CACHE:
                self._texts.popitem(last=False)
        for v, n in zip(views, raw):
            v["text"] = self._texts[(v["rank"], n["id"], n["len"])]
            v["text_truncated"] = n["len"] > len(n["tokens"])

    def _request(self, rec: RequestRecord, now: float) -> dict[str, Any]:
        state = "finished" if rec.t_end is not None else (rec.phases[-1][0] if rec.phases else "running")
        return {"rid": rec.rid, "ns": self.opaque(rec.ns), "state": state, "prompt": rec.prompt,
                "cached": rec.cached, "out": rec.out, "finish": rec.finish,
                "segments": [[kind, round(a - now, 3), round(b - now, 3)] for kind, a, b in rec.segments(now)],
                "marks": [[kind, round(t - now, 3)] for kind, t in rec.marks]}

    def _rates(self, now: float) -> dict[str, Any]:
        rates = self.rates.view(now)
        for point in rates["series"]:
            point["t"] = round(point["t"] - now, 3)
        return rates
