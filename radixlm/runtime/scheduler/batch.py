"""build_forward_batch: the scheduler's plan for a step (PlannedRows) -> the tensors of one forward.

Runs in the scheduler process. The types (PlannedRow, ForwardBatch, AttentionMetadata) live in
runtime/forward.py so the model reads them without importing scheduler code.
"""

from __future__ import annotations

import torch

from radixlm.runtime.forward import AttentionMetadata, ForwardBatch, PlannedRow, to_device
from radixlm.runtime.scheduler.memory_pool import ReqToTokenTable
from radixlm.runtime.scheduler.request import Req


def build_forward_batch(rows: list[PlannedRow[Req]], table: ReqToTokenTable, sm_scale: float,
                        device: torch.device) -> ForwardBatch[Req]:
    ids: list[int] = []
    positions: list[int] = []
    token_rows: list[int] = []  # request-table row of each new token
    starts: list[int] = []
    for row in rows:
        starts.append(len(ids))
        if row.draft:
            ids.extend(row.req.ids_between(row.start, row.req.seq_len()) + row.draft)
        else:
            ids.extend(row.req.ids_between(row.start, row.end))
        positions.extend(range(row.start, row.end))
        token_rows.extend([row.req.row] * row.num_new)
    seq_lens = [r.end for r in rows]
    prefix_lens = [r.start for r in rows]
    extend_lens = [r.num_new for r in rows]
    # Every per-step integer goes to the device in ONE copy, queued without a host sync on CUDA
    # (runtime/forward.py): seven `torch.tensor(..., device=cuda)` calls were seven host syncs per step.
    parts = [ids, positions, token_rows, [r.req.row for r in rows], seq_lens, prefix_lens, extend_lens, starts]
    packed = to_device(torch.tensor([x for part in parts for x in part], dtype=torch.int64), device)
    (ids_t, positions_t, token_rows_t, req_rows_t, seq_lens_t, prefix_lens_t, extend_lens_t,
     starts_t) = packed.split([len(part) for part in parts])
    meta = AttentionMetadata(
        req_to_token=table.table,
        req_pool_indices=req_rows_t,
        seq_lens=seq_lens_t,
        prefix_lens=prefix_lens_t,
        extend_lens=extend_lens_t,
        extend_start_loc=starts_t,
        # the new tokens' slots, gathered on the device in one op (not one slice per request)
        out_cache_loc=table.table[token_rows_t, positions_t],
        is_decode=all(n == 1 and p > 0 for n, p in zip(extend_lens, prefix_lens)),
        sm_scale=sm_scale,
        seq_lens_list=seq_lens,
        prefix_lens_list=prefix_lens,
        extend_lens_list=extend_lens,
        extend_start_loc_list=starts,
    )
    return ForwardBatch(rows, ids_t, positions_t, meta)
