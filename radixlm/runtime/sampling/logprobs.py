"""Log-probability helpers over raw model logits (runs inside the scheduler process).

Every function here returns log_softmax(logits) entries, i.e. what transformers' `log_softmax` of the model
output gives: the RAW logits, before temperature, penalties, bias or grammar masks. The sampler uses
`token_logprobs` for output tokens; the scheduler uses all three for prompt logprobs, top-k logprobs and
`token_ids_logprob`.

They never materialise a [N, V] log_softmax: we gather the few entries needed and subtract the row's
log-normaliser, computed the way torch's log_softmax does (x - max - log(sum(exp(x - max)))) so the
results agree with `torch.log_softmax` to float rounding.
"""

from __future__ import annotations

import torch


def _shifted_log_normalizer(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (row max [N, 1], log(sum(exp(x - max))) [N, 1]) in float32."""
    row_max = logits.amax(dim=-1, keepdim=True)
    # Rows that are entirely -inf would give (-inf) - (-inf) = NaN; shift by 0 instead (result -inf).
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    log_sum = (logits - row_max).exp_().sum(dim=-1, keepdim=True).log_()
    return row_max, log_sum


def _as_float(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    return logits if logits.dtype == torch.float32 else logits.float()


def token_logprobs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """logits [N, V], target_ids [N] (int) -> [N] float32: log_softmax(logits)[i, target_ids[i]]."""
    logits = _as_float(logits)
    target_ids = target_ids.to(device=logits.device, dtype=torch.long).view(-1, 1)
    if target_ids.shape[0] != logits.shape[0]:
        raise ValueError(f"{target_ids.shape[0]} target ids for {logits.shape[0]} logit rows")
    row_max, log_sum = _shifted_log_normalizer(logits)
    picked = logits.gather(1, target_ids)
    return ((picked - row_max) - log_sum).view(-1)


def top_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (values [N, k] float32 sorted descending, token ids [N, k] int64).

    log_softmax is a per-row shift, so the top-k of the logits is the top-k of the logprobs.
    """
    logits = _as_float(logits)
    if not 0 <= k <= logits.shape[-1]:
        raise ValueError(f"k={k} must be in [0, {logits.shape[-1]}]")
    values, ids = torch.topk(logits, k, dim=-1, largest=True, sorted=True)
    row_max, log_sum = _shifted_log_normalizer(logits)
    return (values - row_max) - log_sum, ids


def logprobs_of_ids(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """logits [N, V], ids (same for every row) -> [N, len(ids)] float32 logprobs of those token ids."""
    logits = _as_float(logits)
    index = torch.tensor(ids, dtype=torch.long, device=logits.device)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= logits.shape[-1]):
        raise ValueError(f"token ids must be in [0, {logits.shape[-1]})")
    row_max, log_sum = _shifted_log_normalizer(logits)
    return (logits.index_select(1, index) - row_max) - log_sum
