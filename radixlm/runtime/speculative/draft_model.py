"""STANDALONE speculation: a smaller model with the same tokenizer proposes k tokens autoregressively.

Runs in the scheduler process. The draft has its own ModelRunner, KV pool, request table and radix
cache (a KVCacheManager of its own), so it shares nothing with the target's slots. Each target
request has a shadow Req in the draft's pool; per step the shadows of the requests to draft for run
up to k batched draft forwards (the first catches the shadow up with the target's sequence, each
later one decodes the previous draft token). For a greedy request the proposal is the draft's argmax
(a point mass); for a sampled one the draft samples from its own distribution q at the request's
temperature / top-k / top-p / min-p, and verification does rejection sampling against q (verify.py),
so both stay exact. Rollback: the next proposal compares the token ids the shadow's K/V were
computed for with the target's sequence and truncates the shadow to their common prefix, so rejected
drafts' draft K/V are freed and accepted ones are kept. A finished request's shadow goes into the
draft's radix tree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import torch

from radixlm.radix_cache.tree_node import common_prefix_len
from radixlm.runtime.config import CacheConfig, EngineConfig
from radixlm.runtime.forward import PlannedRow
from radixlm.runtime.model.model_runner import ModelRunner
from radixlm.runtime.sampling.sampler import argmax_rows
from radixlm.runtime.scheduler.batch import build_forward_batch
from radixlm.runtime.scheduler.kv_cache import KVCacheManager
from radixlm.runtime.scheduler.memory_pool import ReqToTokenTable, TokenAllocator
from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.speculative.drafts import Draft
from radixlm.runtime.speculative.verify import draft_probs, sample_draft

logger = logging.getLogger(__name__)


@dataclass
class Shadow:
    req: Req  # the draft pool's request: its own row, kv_len, tree_len, locked node
    kv_ids: list[int] = field(default_factory=list)  # the token ids its K/V were computed for


class DraftModelProposer:
    cheap = False  # a proposal costs draft forwards: none while a request's speculation is paused

    def __init__(self, config: EngineConfig, target: ModelRunner):
        from transformers import AutoConfig

        from radixlm.runtime.model.loader import resolve_model_path

        path = resolve_model_path(config.speculative.speculative_draft_model_path)
        mc = replace(config.model, model_path=str(path), tokenizer_path=None, tp_size=1)
        sc = config.scheduler
        self.runner = ModelRunner(mc, CacheConfig(max_total_tokens=target.max_total_tokens), str(path),
                                  AutoConfig.from_pretrained(path), sc.max_running_requests)
        self.kv = KVCacheManager(TokenAllocator(self.runner.max_total_tokens, self.runner.device),
                                 ReqToTokenTable(sc.max_running_requests, self.runner.context_len + 1,
                                                 self.runner.device),
                                 config.cache.disable_radix_cache)
        self.vocab = min(target.dims.vocab_size, self.runner.dims.vocab_size)
        self._shadows: dict[str, Shadow] = {}

    # ---- proposals --------------------------------------------------------------------------------
    def propose(self, reqs: list[Req], ks: list[int], copying: list[bool] | None = None, large_batch: bool = False
                ) -> list[Draft]:
        drafts: list[list[int]] = [[] for _ in reqs]
        qs: list[list[torch.Tensor]] = [[] for _ in reqs]
        live = [i for i, req in enumerate(reqs) if self._sync(req)]
        for step in range(max(ks, default=0)):
            live = [i for i in live if len(drafts[i]) < ks[i]]
            live = self._draft_step(reqs, live, drafts, qs, step)
            if not live:
                break
        self._rewind(reqs)
        return [Draft(draft, 0, torch.stack(q) if q else None, len(draft)) for draft, q in zip(drafts, qs)]

    def _draft_step(self, reqs: list[Req], live: list[int], drafts: list[list[int]], qs: list[list[torch.Tensor]],
                    step: int) -> list[int]:
        """One batched draft forward for the requests live (indexes into reqs) that have room in the draft's
        pool: each gets one more draft token (and, sampled, the distribution it came from). Returns them."""
        rows = self._rows(reqs, live, drafts, step)
        live = [i for i, row in zip(live, rows) if row is not None]
        rows = [row for row in rows if row is not None]
        if not rows:
            return []
        batch = build_forward_batch(rows, self.kv.table, self.runner.sm_scale, self.runner.device)
        last = torch.tensor([batch.token_index(j, row.end - 1) for j, row in enumerate(rows)])
        logits = self.runner.forward(batch, last)[:, : self.vocab].float()
        for j, (i, tok) in enumerate(zip(live, argmax_rows(logits).tolist())):
            params = reqs[i].params
            if not params.is_greedy:  # sample from q (verify.py's rejection sampling needs q)
                qs[i].append(draft_probs(logits[j], params))
                tok = sample_draft(qs[i][-1], reqs[i].generator)
            drafts[i].append(int(tok))
        return live

    def _rewind(self, reqs: list[Req]) -> None:
        """The shadows' sequences back to their targets' (the drafts are not part of the sequence)."""
        for req in reqs:
            shadow = self._shadows.get(req.rid)
            if shadow is not None:
                shadow.kv_ids = shadow.req.full_ids()[: shadow.req.kv_len]
                shadow.req.output_ids = req.output_ids[:]

    def _rows(self, reqs: list[Req], live: list[int], drafts: list[list[int]], step: int) -> list[PlannedRow | None]:
        rows: list[PlannedRow | None] = []
        for i in live:
            sh = self._shadows[reqs[i].rid].req
            if step > 0:
                sh.output_ids.append(drafts[i][-1])
            start, num = sh.kv_len, sh.seq_len() - sh.kv_len
            rows.append(PlannedRow(sh, start, num) if num > 0 and self.kv.extend(sh, num) else None)
        return rows

    def _sync(self, req: Req) -> bool:
        """Bring req's shadow to the target's sequence (admitting it, or truncating K/V the target did not
        keep); False when the draft pool has no room (the request is simply not drafted this step)."""
        shadow = self._shadows.get(req.rid)
        if shadow is not None:
            sh = shadow.req
            keep = min(common_prefix_len(shadow.kv_ids, req.full_ids(), 0), req.seq_len() - 1, sh.kv_len)
            sh.output_ids = req.output_ids[:]
            if keep >= sh.tree_len:
                self.kv.truncate(sh, keep)
                return True
            self._drop(req.rid)
        sh = Req(rid=req.rid, input_ids=req.input_ids, params=req.params, namespace=req.namespace,
                 output_ids=req.output_ids[:])
        if not self.kv.admit(sh, req.seq_len() - 1):
            return False
        self._shadows[req.rid] = Shadow(sh)
        return True

    def observe(self, reqs: list[Req]) -> None:
        pass  # the draft sees a request's tokens when it drafts for it

    def on_verified(self, req: Req, proposed: int, accepted: int) -> None:
        pass  # the next proposal truncates the shadow to the verified sequence

    # ---- lifecycle --------------------------------------------------------------------------------
    def on_finish(self, req: Req) -> None:
        self._drop(req.rid, req)

    def _drop(self, rid: str, req: Req | None = None) -> None:
        shadow = self._shadows.pop(rid, None)
        if shadow is None:
            return
        sh = shadow.req
        target_ids = req.full_ids() if req is not None else sh.full_ids()
        keep = max(sh.tree_len, min(common_prefix_len(shadow.kv_ids, target_ids, 0), sh.kv_len))
        self.kv.truncate(sh, keep)  # only K/V computed for the final tokens go into the draft's tree
        sh.output_ids = target_ids[len(sh.input_ids) :]
        self.kv.release(sh)

    def flush(self) -> None:
        if not self._shadows:
            self.kv.flush()

    def check_integrity(self, idle: bool) -> None:
        self.kv.check_integrity([s.req for s in self._shadows.values()])
        if idle:
            assert not self._shadows, "draft shadows left while idle"
            self.kv.check_idle()
