"""Scheduler: continuous batching with chunked prefill, mixed prefill+decode steps and retraction.

Runs in the scheduler process; a plain class with no sockets (loop.py does the IO, the in-process
Engine calls it directly). Each `step()` plans one forward pass:
  1. every decoding request gets one token (retracting victims if the pool cannot hold them),
  2. requests part-way through a chunked prefill continue within the per-step token budget,
  3. waiting requests are admitted in policy order while budget, rows and KV capacity last,
then runs the model and hands the logits to the OutputProcessor.
"""

from __future__ import annotations

import logging
from collections import deque

from radixlm.radix_cache.token_logprobs import CachedLogprobs
from radixlm.radix_cache.tree_node import common_prefix_len
from radixlm.runtime.config import SchedulerConfig
from radixlm.runtime.forward import PlannedRow
from radixlm.runtime.messages import RequestError, TokenOut
from radixlm.runtime.model.model_runner import ModelRunner
from radixlm.runtime.scheduler import prompt_logprobs
from radixlm.runtime.scheduler.batch import build_forward_batch
from radixlm.runtime.scheduler.kv_cache import KVCacheManager
from radixlm.runtime.scheduler.grammar import GrammarManager, grammar_spec
from radixlm.runtime.scheduler.output_processor import OutputProcessor
from radixlm.runtime.scheduler.policy import CACHE_AWARE, SchedulePolicy
from radixlm.runtime.scheduler.request import FinishReason, Req
from radixlm.runtime.scheduler.stats import CacheStats

logger = logging.getLogger(__name__)

# Defer a waiting request whose prompt shares at least this many not-yet-cached tokens with a request
# admitted in the same step (SGLang's in-batch prefix caching): the prefix is computed once.
IN_BATCH_PREFIX_THRESHOLD = 32


class Scheduler:
    def __init__(self, runner: ModelRunner, kv: KVCacheManager, config: SchedulerConfig,
                 outputs: OutputProcessor, grammar: GrammarManager):
        self.runner = runner
        self.kv = kv
        self.config = config
        self.out = outputs
        self.grammar = grammar
        self.policy = SchedulePolicy(config.schedule_policy, kv.tree)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.stats = CacheStats()
        self._arrivals = 0
        self.num_forward_steps = 0
        self.num_computed_tokens = 0  # tokens pushed through the model (prefill + decode)
        self.spec = None  # speculative.controller.SpecController (set by the builder when speculation is on)

    # ---- requests in and out ----------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        if len(self.waiting) + self.grammar.num_pending() >= self.config.max_queued_requests:
            raise OverflowError("the waiting queue is full")
        self._arrivals += 1
        req.arrival = self._arrivals
        if grammar_spec(req.params) is not None:
            self.grammar.submit(req)  # waits in the grammar queue until compiled (off this loop)
        else:
            self.waiting.append(req)

    def abort(self, rid: str) -> list[TokenOut]:
        """Abort by exact rid; returns the terminal output (empty if the rid is unknown or done)."""
        pending = self.grammar.remove(rid)
        if pending is not None:
            return [self._finish_now(pending, "aborted by request")]
        for queue in (self.waiting, self.running):
            for req in list(queue):
                if req.rid == rid:
                    queue.remove(req)
                    return [self._finish_now(req, "aborted by request")]
        return []

    def abort_all(self, message: str = "aborted") -> list[TokenOut]:
        reqs = self.grammar.drain() + list(self.waiting) + self.running
        self.waiting.clear()
        self.running = []
        return [self._finish_now(r, message) for r in reqs]

    def _finish_now(self, req: Req, message: str) -> TokenOut:
        req.finish = FinishReason("abort", message=message)
        self.kv.release(req)
        if self.spec is not None:
            self.spec.on_finish(req)
        return self.out.make_output(req, [])

    def settle(self) -> None:
        """Housekeeping deferred off the steps' critical path (speculation's finished requests); the loop
        calls it once idle, after the last outputs have gone."""
        if self.spec is not None:
            self.spec.settle()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.grammar.num_pending())

    def has_runnable(self) -> bool:
        """Work a step can do now (requests waiting only for their grammar to compile are not)."""
        return bool(self.waiting or self.running)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; only allowed when idle (returns False otherwise)."""
        if self.has_work():
            return False
        self.kv.flush()
        if self.spec is not None:
            self.spec.flush()
        return True

    # ---- one step ---------------------------------------------------------------------------------
    def step(self) -> list[TokenOut]:
        outputs = self._collect_grammars()
        if not self.has_runnable():
            return outputs
        rows = self._plan()
        if not rows:
            return outputs + self._drain_stuck()
        batch = build_forward_batch(rows, self.kv.table, self.runner.sm_scale, self.runner.device)
        plan = self.out.plan_logits(batch)
        logits = self.runner.forward(batch, plan.indices, plan.argmax_only, keep_hidden=bool(plan.embed))
        if plan.embed:
            self.out.pool(batch, plan, self.runner.last_hidden())
        if self.spec is not None:  # while the device runs the step (a GPU forward returns at launch)
            self.spec.observe(self.running)
        self.num_forward_steps += 1
        self.num_computed_tokens += batch.num_tokens
        step_outputs, finished = self.out.process(batch, plan, logits)
        outputs += step_outputs
        for req in finished:
            self.running.remove(req)
            self.kv.release(req)
            if self.spec is not None:
                self.spec.on_finish(req, later=True)  # settled after the next launches, or once idle
        for row in rows:
            # A prompt (or chunk of one) just computed goes into the tree now, not at finish, so
            # siblings admitted in the next steps share it (SGLang's cache_unfinished_req).
            if row.num_new > 1 and not row.draft and not row.req.finished:
                self.kv.cache_computed_prefix(row.req)
        return outputs

    def _collect_grammars(self) -> list[TokenOut]:
        ready, failed = self.grammar.poll()
        for req in sorted(ready, key=lambda r: r.arrival):
            self.waiting.append(req)
        outputs = []
        for req, exc in failed:
            req.finish = FinishReason("abort", message=str(exc))
            out = self.out.make_output(req, [])
            out.error = RequestError(getattr(exc, "code", "invalid_grammar"), str(exc), getattr(exc, "param", None))
            outputs.append(out)
        return outputs

    def _plan(self) -> list[PlannedRow]:
        decode = [r for r in self.running if r.remaining_prefill() == 1]
        decode = self._reserve_decode_slots(decode)
        rows = self._decode_rows(decode)
        budget = self.config.chunked_prefill_size
        for req in self.running:
            if req.remaining_prefill() > 1 and budget > 0:
                row = self._extend(req, budget)
                if row is not None:
                    rows.append(row)
                    budget -= row.num_new
        rows += self._admit(budget)
        if not self.config.enable_mixed_chunk and len(rows) > len(decode) and decode:
            rows = self._undo_decode(rows, decode)
        return rows

    def _decode_rows(self, decode: list[Req]) -> list[PlannedRow]:
        """One row per decoding request; with speculative decoding, a request with a draft of k tokens gets
        a verify row [its last token, d1..dk] when the pool has k free slots (a draft never evicts cached
        prefixes nor causes a retraction: without room it is simply not verified this step)."""
        rows = [PlannedRow(r, r.kv_len - 1, 1) for r in decode]
        if self.spec is None or not decode:
            return rows
        drafted = [(row, draft) for row, draft in zip(rows, self.spec.propose(decode, self.running)) if draft]
        if not drafted:
            return rows
        if self.kv.allocator.num_free() >= sum(len(draft) for _, draft in drafted):  # one allocation, no eviction
            taken = self.kv.extend_each([row.req for row, _ in drafted], [len(draft) for _, draft in drafted])
            assert taken, "the free slots were counted"
        else:  # as many as the free slots hold, in order
            drafted = [(row, draft) for row, draft in drafted
                       if self.kv.allocator.num_free() >= len(draft) and self.kv.extend(row.req, len(draft))]
        for row, draft in drafted:
            row.num_new += len(draft)
            row.draft = draft
        return rows

    def _reserve_decode_slots(self, decode: list[Req]) -> list[Req]:
        """Allocate one slot per decoding request, retracting victims while the pool is short."""
        while decode and self.kv.available() < len(decode):
            victim = self._pick_victim()
            if victim is None:
                break
            self._retract(victim)
            decode = [r for r in decode if r is not victim]
        if not decode or self.kv.extend_each(decode, [1] * len(decode)):  # one allocation, one table write
            return decode
        return [req for req in decode if self.kv.extend(req, 1)]  # as many as the pool holds

    def _pick_victim(self) -> Req | None:
        if len(self.running) <= 1:
            return None
        # SGLang's choice: fewest generated tokens first, then the longest prompt (cheapest to redo
        # relative to the memory it frees, and least work thrown away).
        return min(self.running, key=lambda r: (len(r.output_ids), -len(r.input_ids)))

    def _retract(self, req: Req) -> None:
        self.running.remove(req)
        self.kv.release(req)  # its K/V go into the radix tree: the retry usually re-matches them
        req.num_retractions += 1
        self.stats.num_retractions += 1
        self.waiting.appendleft(req)

    def _extend(self, req: Req, budget: int) -> PlannedRow | None:
        start = req.kv_len
        num = min(req.remaining_prefill(), budget)
        if not self.kv.extend(req, num):
            return None
        return PlannedRow(req, start, num)

    def _admit(self, budget: int) -> list[PlannedRow]:
        rows: list[PlannedRow] = []
        if not self.waiting or budget <= 0 or len(self.running) >= self.config.max_running_requests:
            return rows  # nothing can be admitted: skip the (prefix-matching) policy pass
        reserved = self._reserved_tokens()
        cache_aware = self.policy.active_policy(len(self.waiting)) in CACHE_AWARE
        in_batch: list[Req] = []
        for req in self.policy.order(list(self.waiting)):
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if cache_aware and _shares_uncached_prefix(req, in_batch):
                continue  # a sibling computes the shared part this step; this one reuses it next step
            owes_logprobs = req.wants_input_logprobs() and not req.input_logprobs_done
            cached = self.kv.cached_prompt_logprobs(req) if owes_logprobs else None
            if not self.kv.admit(req, self._max_match(req, cached)):
                break
            if owes_logprobs:
                prompt_logprobs.begin(req, cached, self.kv.logprob_top_k)
            num = min(req.remaining_prefill(), budget)
            # Room for part of its future decode tokens; a request alone in the engine needs none
            # (retraction covers it), so a large request can always start when the engine is idle.
            reserve = int(self.config.new_token_ratio * (req.max_new_tokens - len(req.output_ids)))
            need = num + (reserve if self.running else 0)
            if self.kv.available() - reserved < need or not self.kv.extend(req, num):
                self.kv.release(req)
                break
            self._record_admission(req)
            in_batch.append(req)
            self.waiting.remove(req)
            self.running.append(req)
            rows.append(PlannedRow(req, req.kv_len - num, num))
            budget -= num
            reserved += need - num
        return rows

    def _max_match(self, req: Req, cached: CachedLogprobs | None) -> int:
        # Always compute at least the last token (its logits are what we sample from); and when prompt
        # logprobs are still owed, compute every position they cover that the tree does not know.
        if req.wants_input_logprobs() and not req.input_logprobs_done:
            return prompt_logprobs.match_limit(req, cached)
        return req.seq_len() - 1

    def _record_admission(self, req: Req) -> None:
        if req.tree_len and self.kv.tree is not None:  # the dashboard's per-node hit counts
            self.kv.tree.record_hit(req.last_node)
        if not req.first_admitted:
            req.first_admitted = True
            req.cached_len = req.tree_len
            self.stats.record_prompt(len(req.input_ids), req.tree_len)

    def _reserved_tokens(self) -> int:
        ratio = self.config.new_token_ratio
        return sum(int(ratio * max(0, r.max_new_tokens - len(r.output_ids))) for r in self.running)

    def _undo_decode(self, rows: list[PlannedRow], decode: list[Req]) -> list[PlannedRow]:
        """Non-mixed mode: give the step to prefill and return the decode slots just taken."""
        for row in rows:
            if row.req in decode:
                self.kv.truncate(row.req, row.start)  # its one decode slot and any draft slots
        return [r for r in rows if r.req not in decode]

    def _drain_stuck(self) -> list[TokenOut]:
        """Nothing could be scheduled although work exists: free memory by retracting a request, or,
        when a single request cannot fit even alone, end it with an error instead of spinning."""
        if len(self.running) > 1:
            self._retract(self._pick_victim())
            return []
        if self.running:
            return [self._finish_now(self.running.pop(), "KV cache pool exhausted")]
        if self.waiting:
            return [self._finish_now(self.waiting.popleft(), "request does not fit in the KV cache pool")]
        return []

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.running)
        if self.spec is not None:
            self.spec.check_integrity(idle=not self.has_work())


def _shares_uncached_prefix(req: Req, in_batch: list[Req]) -> bool:
    ids = req.full_ids()
    for other in in_batch:
        if other.namespace != req.namespace:
            continue
        n = common_prefix_len(ids, other.full_ids(), 0)
        if n - req.prefix_len >= IN_BATCH_PREFIX_THRESHOLD:
            return True
    return False
