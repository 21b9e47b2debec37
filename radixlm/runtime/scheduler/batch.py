"""ForwardBatch: the tensors of one forward pass, built from the scheduler's plan for a step.

Runs in the scheduler process. A step is one flat batch of new tokens: request i contributes
`num_new[i]` tokens starting at sequence position `start[i]` (its kv_len before the step). Decode rows
are the case num_new == 1; a mixed step simply has both kinds of rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.model.layers.attention import AttentionMetadata
from radixlm.runtime.scheduler.memory_pool import ReqToTokenTable
from radixlm.runtime.scheduler.request import Req


@dataclass
class PlannedRow:
    req: Req
    start: int  # sequence position of the first new token (= kv_len before the step)
    num_new: int

    @property
    def end(self) -> int:
        return self.start + self.num_new


@dataclass
class ForwardBatch:
    rows: list[PlannedRow]
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    meta: AttentionMetadata

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def token_index(self, row_idx: int, seq_pos: int) -> int:
        """Index in the flat token dim of sequence position seq_pos of row row_idx."""
        row = self.rows[row_idx]
        return self.meta.extend_start_loc_list[row_idx] + (seq_pos - row.start)


def build_forward_batch(rows: list[PlannedRow], table: ReqToTokenTable, sm_scale: float,
                        device: torch.device) -> ForwardBatch:
    ids: list[int] = []
    positions: list[int] = []
    starts: list[int] = []
    for row in rows:
        starts.append(len(ids))
        ids.extend(row.req.full_ids()[row.start : row.end])
        positions.extend(range(row.start, row.end))
    req_rows = torch.tensor([r.req.row for r in rows], dtype=torch.int64)
    out_cache_loc = torch.cat([table.table[r.req.row, r.start : r.end] for r in rows])
    seq_lens = [r.end for r in rows]
    prefix_lens = [r.start for r in rows]
    extend_lens = [r.num_new for r in rows]
    meta = AttentionMetadata(
        req_to_token=table.table,
        req_pool_indices=req_rows.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64, device=device),
        extend_lens=torch.tensor(extend_lens, dtype=torch.int64, device=device),
        extend_start_loc=torch.tensor(starts, dtype=torch.int64, device=device),
        out_cache_loc=out_cache_loc.to(device),
        is_decode=all(n == 1 and p > 0 for n, p in zip(extend_lens, prefix_lens)),
        sm_scale=sm_scale,
        seq_lens_list=seq_lens,
        prefix_lens_list=prefix_lens,
        extend_lens_list=extend_lens,
        extend_start_loc_list=starts,
    )
    return ForwardBatch(rows, torch.tensor(ids, dtype=torch.int64, device=device),
                        torch.tensor(positions, dtype=torch.int64, device=device), meta)
