"""CUDA graphs for speculative verify steps: every row [last token, d1..dk] padded to one width.

Runs inside the scheduler process, beside the decode graphs (cuda_graph.py), when speculative decoding
is on. A verify step (runtime/speculative/) is an extend step: row i brings 1 + len(draft_i) tokens, and
a decoding row without a draft brings 1. Run eagerly it pays a launch per kernel per layer, which on a
GPU costs several times the step's arithmetic for a small model, so speculation lost to plain decode
replayed from a graph (docs/benchmarks.md, "GPU"). Here each bucket of B rows is captured once as B rows
of `width` (1 + the most draft tokens a row can carry) tokens: row i's tokens sit at i * width onwards,
the rest of its width is padding (token 0 at position 0, K/V written to the scratch slot 0). The extend
kernel reads each row's true length as seq_lens - prefix_lens, so padding neither attends nor is
attended to (its queries are masked and its keys lie past the row's seq_len); its logits are dropped.
SGLang's verify graphs (EAGLE's target verify) pad every row to num_draft_tokens the same way.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from radixlm.runtime.forward import AttentionMetadata, ForwardBatch, to_device
from radixlm.runtime.model.cuda_graph import CudaGraph, capture_buckets, default_buckets

logger = logging.getLogger(__name__)

# Each bucket keeps its logits [B * width, vocab] (fp32) alive between replays: 64 rows x 9 tokens of a
# 49k vocab is 113 MB, and the buckets together hold about 4.6x the largest. Bigger verify steps run
# eagerly, where launches are a small share of the step.
MAX_VERIFY_BS = 64


class VerifyGraphRunner:
    def __init__(self, forward: Callable[..., torch.Tensor], req_to_token: torch.Tensor, sm_scale: float,
                 max_bs: int, width: int, device: torch.device, graph_cls: type = CudaGraph):
        """forward(input_ids, positions, meta, logits_indices) -> logits, as for DecodeGraphRunner;
        width: the longest verify row (1 + the most draft tokens a row carries)."""
        self.max_bs = min(max_bs, MAX_VERIFY_BS)
        self.buckets = default_buckets(self.max_bs)
        self.width = width
        n = self.max_bs * width
        self.tokens = torch.zeros(3, n, dtype=torch.int64, device=device)  # ids, positions, KV slots
        self.rows = torch.zeros(4, self.max_bs, dtype=torch.int64, device=device)  # req, seq, prefix, extend
        self.starts = torch.arange(0, n, width, dtype=torch.int64, device=device)
        self.all_tokens = torch.arange(n, device=device)

        def step_for(bs: int) -> Callable[[], torch.Tensor]:
            meta, t = self._meta(bs, req_to_token, sm_scale), bs * width
            return lambda: forward(self.tokens[0, :t], self.tokens[1, :t], meta, self.all_tokens[:t])

        self.graphs, self.outputs = capture_buckets(self.buckets, graph_cls, step_for)
        logger.info("captured verify graphs (%d tokens a row) for batch sizes %s", width, self.buckets)

    def _meta(self, bs: int, req_to_token: torch.Tensor, sm_scale: float) -> AttentionMetadata:
        r = self.rows
        # The host lists are placeholders but for extend_lens_list, whose max sizes the extend kernel's
        # grid (one block of rows covers a row's width); the kernel reads true lengths on the device.
        return AttentionMetadata(
            req_to_token=req_to_token, req_pool_indices=r[0, :bs], seq_lens=r[1, :bs], prefix_lens=r[2, :bs],
            extend_lens=r[3, :bs], extend_start_loc=self.starts[:bs], out_cache_loc=self.tokens[2, :bs * self.width],
            is_decode=False, sm_scale=sm_scale, seq_lens_list=[], prefix_lens_list=[],
            extend_lens_list=[self.width] * bs, extend_start_loc_list=list(range(0, bs * self.width, self.width)))

    def can_run(self, batch: ForwardBatch, logits_indices: torch.Tensor) -> bool:
        """A step of at most max_bs decoding rows, each its last token plus a draft of at most width - 1
        tokens (no prompt chunk), and a host tensor of logits indices (a device one would mean a sync)."""
        rows = batch.rows
        return (0 < len(rows) <= self.max_bs and logits_indices.device.type == "cpu"
                and all(row.num_new == 1 + len(row.draft) <= self.width for row in rows))

    def replay(self, batch: ForwardBatch, logits_indices: torch.Tensor) -> torch.Tensor:
        """The logits at logits_indices (indices into the batch's own, unpadded token order)."""
        n, w = len(batch.rows), self.width
        bs = next(b for b in self.buckets if b >= n)
        padded = [i * w + j for i, row in enumerate(batch.rows) for j in range(row.num_new)]
        wanted = [padded[i] for i in logits_indices.tolist()]
        index = to_device(torch.tensor(padded + wanted, dtype=torch.int64), self.tokens.device)
        padded_t, wanted_t = index.split([len(padded), len(wanted)])
        meta = batch.meta
        self.tokens[:, :bs * w].zero_()  # padding: token 0 at position 0, K/V to the scratch slot 0
        self.tokens.index_copy_(1, padded_t, torch.stack([batch.input_ids, batch.positions, meta.out_cache_loc]))
        self.rows[:, :n].copy_(torch.stack([meta.req_pool_indices, meta.seq_lens, meta.prefix_lens,
                                            meta.extend_lens]))
        if bs > n:  # padding rows: no tokens (seq_len = prefix_len = 0)
            self.rows[:, n:bs].zero_()
        self.graphs[bs].replay()
        return self.outputs[bs].index_select(0, wanted_t)
