"""A periodic status line while the scheduler has work, in the shape of SGLang's decode log:

    Decode batch. #running-req: 3, #token: 1536, token usage: 0.01, cache hit rate: 42.10%,
    gen throughput (token/s): 812.40, #queue-req: 0

Runs in the scheduler process (driven by loop.py). #token and token usage count the KV slots held by
requests and locked cache (free and evictable slots are capacity); the hit rate is cached / prompt tokens
since start; the throughput is output tokens since the previous line over the time since then.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from radixlm.runtime.messages import TokenOut
from radixlm.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger("radixlm.scheduler")

STATUS_LOG_INTERVAL_S = 10.0


class StatusLog:
    def __init__(self, interval_s: float = STATUS_LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self._since = clock()
        self._num_output_tokens = 0
        self._busy = False

    def on_outputs(self, outputs: list[TokenOut]) -> None:
        self._num_output_tokens += sum(len(out.new_ids) for out in outputs)

    def maybe_log(self, scheduler: Scheduler) -> str | None:
        """Each loop turn: log (and return) the status line once the interval has passed with work."""
        now = self.clock()
        busy = bool(scheduler.running or scheduler.waiting)
        if not self._busy or not busy:  # work (re)starts, or stops: the next line measures from here
            self._busy, self._since, self._num_output_tokens = busy, now, 0
            return None
        if now - self._since < self.interval_s:
            return None
        elapsed, tokens = now - self._since, self._num_output_tokens
        self._since, self._num_output_tokens = now, 0
        line = status_line(scheduler, tokens / elapsed if elapsed > 0 else 0.0)
        logger.info(line)
        return line


def status_line(scheduler: Scheduler, gen_tokens_per_s: float) -> str:
    kv = scheduler.kv
    total = kv.allocator.size
    evictable = kv.tree.evictable_size() if kv.tree is not None else 0
    used = total - kv.allocator.num_free() - evictable
    line = (f"Decode batch. #running-req: {len(scheduler.running)}, #token: {used}, "
            f"token usage: {used / max(1, total):.2f}, cache hit rate: {100 * scheduler.stats.hit_rate:.2f}%, "
            f"gen throughput (token/s): {gen_tokens_per_s:.2f}, #queue-req: {len(scheduler.waiting)}")
    spec = getattr(scheduler, "spec", None)
    if spec is not None:  # totals since start (SGLang logs the accept length of speculative decoding)
        spec = spec.stats
        line += (f", spec accept rate: {100 * spec.acceptance_rate:.2f}%, "
                 f"spec accept len: {spec.num_emitted / max(1, spec.num_verify_rows):.2f}")
    return line
