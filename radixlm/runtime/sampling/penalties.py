"""Logit processors that run before temperature and filtering (inside the scheduler process).

`apply_processors` is what the sampler calls: it copies the logits once (only if some row needs a
processor) and runs, in this order, logit_bias -> repetition penalty -> frequency/presence penalties ->
min_new_tokens blocking -> grammar allowed-mask. Each processor edits `logits` [B, W] in place, touching
only the batch rows listed in `row_ids`, in one batched torch call (no per-row loop over the vocabulary).

Index and value tensors are built on the host and reach the device through runtime/forward.py (no
host sync on CUDA); counting tokens (torch.unique) also runs on the host, where the ids already are.

Semantics:
  * logit_bias: logits[t] += bias[t] (OpenAI).
  * repetition penalty (HF `RepetitionPenaltyLogitsProcessor`, over prompt + output tokens, each token
    once however often it occurs): positive logits are divided by the penalty, negative ones multiplied.
  * frequency / presence (OpenAI, over output tokens only): logits[t] -= freq * count[t] + presence * (count[t] > 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixlm.runtime.forward import to_device

if TYPE_CHECKING:  # sampler.py imports this module; the row type is only needed for hints
    from radixlm.runtime.sampling.sampler import SamplingRow

_NEG_INF = float("-inf")


def apply_processors(logits: torch.Tensor, rows: list[SamplingRow], eos_token_ids: frozenset[int]
                     ) -> torch.Tensor | None:
    """logits [B, W] -> a processed copy, or None (and no copy) when no row needs any processor."""
    width = logits.shape[-1]
    bias = [i for i, r in enumerate(rows) if r.params.logit_bias]
    repetition = [i for i, r in enumerate(rows)
                  if r.params.repetition_penalty != 1.0 and (r.prompt_ids or r.output_ids)]
    freq_pres = [i for i, r in enumerate(rows) if r.output_ids
                 and (r.params.frequency_penalty != 0.0 or r.params.presence_penalty != 0.0)]
    blocked: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if len(r.output_ids) < r.params.min_new_tokens:
            ids = sorted(t for t in eos_token_ids.union(r.params.stop_token_ids) if 0 <= t < width)
            if ids:
                blocked[i] = ids
    masked = [i for i, r in enumerate(rows) if r.allowed_mask is not None]
    if not (bias or repetition or freq_pres or blocked or masked):
        return None
    logits = logits.clone()
    if bias:
        apply_logit_bias(logits, bias, [rows[i].params.logit_bias for i in bias])
    if repetition:
        apply_repetition_penalty(logits, repetition, [rows[i].prompt_ids + rows[i].output_ids for i in repetition],
                                 [rows[i].params.repetition_penalty for i in repetition])
    if freq_pres:
        apply_frequency_presence(logits, freq_pres, [rows[i].output_ids for i in freq_pres],
                                 [rows[i].params.frequency_penalty for i in freq_pres],
                                 [rows[i].params.presence_penalty for i in freq_pres])
    if blocked:
        block_tokens(logits, list(blocked), list(blocked.values()))
    if masked:
        apply_allowed_masks(logits, masked, [rows[i].allowed_mask for i in masked])
    return logits


def _flatten_host(row_ids: list[int], token_lists: list[list[int]]) -> torch.Tensor:
    """int64 [3, N] on the host: batch row, token id and position in row_ids, per listed token."""
    lengths = torch.tensor([len(t) for t in token_lists], dtype=torch.long)
    flat_ids = torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.long)
    positions = torch.repeat_interleave(torch.arange(len(row_ids)), lengths)
    batch_rows = torch.tensor(row_ids, dtype=torch.long)[positions]
    return torch.stack([batch_rows, flat_ids, positions])


def _flatten(row_ids: list[int], token_lists: list[list[int]], device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch row per token, token id per token, position in row_ids per token), all int64 on device."""
    batch_rows, flat_ids, positions = to_device(_flatten_host(row_ids, token_lists), device).unbind(0)
    return batch_rows, flat_ids, positions


def apply_logit_bias(logits: torch.Tensor, row_ids: list[int], biases: list[dict[int, float]]) -> None:
    """logits[row, token] += bias for every (token, bias) in each row's dict."""
    token_lists = [list(b.keys()) for b in biases]
    batch_rows, token_ids, _ = _flatten(row_ids, token_lists, logits.device)
    values = to_device(torch.tensor([v for b in biases for v in b.values()], dtype=logits.dtype), logits.device)
    logits.index_put_((batch_rows, token_ids), values, accumulate=True)


def apply_repetition_penalty(logits: torch.Tensor, row_ids: list[int], token_lists: list[list[int]],
                             penalties: list[float]) -> None:
    """HF repetition penalty on every token that occurs in the row's token list (prompt + output).

    Gather-then-scatter: a token that occurs twice reads the same original value twice and writes the
    same result twice, so it is penalised once, as in HF.
    """
    batch_rows, token_ids, positions = _flatten(row_ids, token_lists, logits.device)
    penalty = to_device(torch.tensor(penalties, dtype=logits.dtype), logits.device)[positions]
    scores = logits[batch_rows, token_ids]
    logits[batch_rows, token_ids] = torch.where(scores < 0, scores * penalty, scores / penalty)


def apply_frequency_presence(logits: torch.Tensor, row_ids: list[int], output_lists: list[list[int]],
                             frequency: list[float], presence: list[float]) -> None:
    """OpenAI penalties from output-token counts.

    The counts are sparse, one entry per distinct (row, token) pair, so the cost grows with the number of
    output tokens, not with B x V.
    """
    width = logits.shape[-1]
    batch_rows, token_ids, _ = _flatten_host(row_ids, output_lists)
    # On the host: torch.unique on a device tensor would sync (its output size is data-dependent).
    keys, counts = torch.unique(batch_rows * width + token_ids, return_counts=True)
    rows, tokens = keys // width, keys % width
    freq = torch.zeros(logits.shape[0], dtype=logits.dtype)
    pres = torch.zeros_like(freq)
    index = torch.tensor(row_ids, dtype=torch.long)
    freq[index] = torch.tensor(frequency, dtype=logits.dtype)
    pres[index] = torch.tensor(presence, dtype=logits.dtype)
    delta = counts.to(logits.dtype) * freq[rows] + pres[rows]  # count > 0 for every key
    rows, tokens = to_device(torch.stack([rows, tokens]), logits.device).unbind(0)
    logits.index_put_((rows, tokens), to_device(-delta, logits.device), accumulate=True)


def block_tokens(logits: torch.Tensor, row_ids: list[int], token_lists: list[list[int]]) -> None:
    """logits[row, token] = -inf (min_new_tokens: eos and stop_token_ids may not be sampled yet)."""
    batch_rows, token_ids, _ = _flatten(row_ids, token_lists, logits.device)
    # torch.full, not torch.tensor(..., device=): a fill kernel, not a host-to-device copy
    logits.index_put_((batch_rows, token_ids), torch.full((), _NEG_INF, dtype=logits.dtype, device=logits.device))


def apply_allowed_masks(logits: torch.Tensor, row_ids: list[int], masks: list[torch.Tensor]) -> None:
    """-inf outside each row's bool allowed mask.

    A mask may be shorter than W (the grammar knows only the tokenizer's vocabulary: missing columns are
    disallowed) or longer (columns past W are padding the sampler never considers).
    """
    width = logits.shape[-1]
    allowed = torch.zeros(len(row_ids), width, dtype=torch.bool, device=logits.device)
    for i, mask in enumerate(masks):
        n = min(width, mask.shape[-1])
        allowed[i, :n] = mask[:n].to(device=logits.device, dtype=torch.bool)
    index = torch.tensor(row_ids, dtype=torch.long, device=logits.device)
    logits[index] = logits[index].masked_fill_(~allowed, _NEG_INF)
