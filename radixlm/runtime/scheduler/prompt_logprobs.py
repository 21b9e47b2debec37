"""Prompt logprobs a request takes from the radix tree and gives back to it. Scheduler process.

A request that wants prompt logprobs (/v1/completions with echo + logprobs, /generate with logprob_start_len)
needs the logits of every prompt position from its logprob start on, so its KV match used to stop there and a
shared prefix (an eval harness's few-shot examples) was recomputed every time. The tree now keeps the logprob
and top-k of each prompt token some request computed (radix_cache/token_logprobs.py): at admission a request
takes the known ones for its matched prefix (`begin`) and computes only the rest; what it computes is recorded
(`record`) in req.prompt_logprobs, which KVCacheManager inserts into the tree with the request's KV.
"""

from __future__ import annotations

import torch

from radixlm.radix_cache.token_logprobs import CachedLogprobs, TokenLogprobs
from radixlm.runtime.scheduler.request import Req


def match_limit(req: Req, cached: CachedLogprobs | None) -> int:
    """The longest prefix a request still owed prompt logprobs may take from the tree: up to its logprob start,
    or further where the tree knows the logprobs too; never its last prompt token (its logits are sampled)."""
    start = req.logprob_start() if cached is None else cached.length
    return min(req.seq_len() - 1, start)


def begin(req: Req, cached: CachedLogprobs | None, top_k: int | None) -> None:
    """At each admission of a request still owed prompt logprobs: its entries start over (a retracted request
    takes again what the tree knows, and recomputes the rest), with the null entry of its first position and
    the tree's entries for the tokens of its matched prefix past that. top_k: what the tree keeps (None: no
    tree, nothing recorded)."""
    acc, start = req.logprobs, req.logprob_start()
    acc.input_token.clear()
    acc.input_top.clear()
    acc.input_ids_logprob.clear()
    # Nothing to record without a tree, or when only the last prompt token's entry is wanted (it has no logprob).
    computes = top_k is not None and start < len(req.input_ids) - 1
    req.prompt_logprobs = TokenLogprobs.unknown(len(req.input_ids), top_k) if computes else None
    if cached is None or req.tree_len <= start:
        return
    acc.input_token.append((None, req.input_ids[start]))
    acc.input_top.append(None)
    acc.input_ids_logprob.append(None)
    taken = cached.logprobs.slice(0, req.tree_len - start)  # tokens (start, tree_len]
    ids = req.input_ids[start + 1 : req.tree_len + 1]
    acc.input_token.extend(zip(taken.values.tolist(), ids))
    acc.input_ids_logprob.extend([None] * len(ids))  # token_ids_logprob requests never take from the tree
    k = req.logprob.top_logprobs_num
    if k > 0:
        values, top_ids = taken.top_values[:, :k].tolist(), taken.top_ids[:, :k].tolist()
        acc.input_top.extend(list(zip(v, i)) for v, i in zip(values, top_ids))
    else:
        acc.input_top.extend([None] * len(ids))


def record(req: Req, first: int, values: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """Computed logprobs of prompt tokens [first, first + len(values)) and their top-k, kept for the tree."""
    if req.prompt_logprobs is not None and top is not None:
        req.prompt_logprobs.put(first, values, *top)
