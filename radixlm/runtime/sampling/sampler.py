"""Sampler: one token per running request from the last-position logits (inside the scheduler process).

Per row, in this order: logit_bias -> repetition / frequency / presence penalties -> min_new_tokens
(eos and stop_token_ids blocked) -> grammar allowed-mask -> greedy argmax (temperature 0 or top_k 1), or
temperature -> top_k -> top_p -> min_p (HF warper semantics, in HF's order) -> sample.

Everything is batched: an all-greedy batch with no processors is one argmax over a view of the logits;
otherwise the logits are copied once, each processor runs once over the rows that need it, and the
filters look for one threshold per row among its top 1024 logits (whole-row sort only where the kept
set runs past them). Sampling is inverse-CDF with ONE uniform per row (per-token noise would cost a
49k-wide RNG draw per row): a two-level search, over block masses then inside one block, so no
[B, V] cumulative sum is needed. A seeded row draws its uniform from its own generator and its CDF
depends only on its own logits, so its tokens depend only on its seed and logits, never on its batch
neighbours; unseeded rows share one draw from the global RNG.

Rows under a grammar skip the full-row mask where they can (constrained/bitmask.py,
`greedy_under_grammar`, and `_sample_allowed_lists` here): a greedy row with an allowed-id list takes the
argmax of its few allowed entries, one with an additive row or bitmask keeps the unmasked argmax when
the grammar allows it (both are the masked row's argmax); a sampled row with an allowed-id list samples
from its allowed logits alone (the masked row's distribution). Only the other rows are masked.

Columns at or past `vocab_size` (padding of the model's embedding matrix) are never sampled. The
returned logprobs are log_softmax over the full RAW logits row (all columns, before any processing),
which is what transformers' log-softmax of the model output gives; only for rows with `wants_logprob`.

Dead end: if a row's masks leave no token (all -inf, e.g. a grammar that allows nothing while
min_new_tokens blocks eos), the row gets the eos token (the smallest eos id; 0 without one) instead of
NaN sampling; the scheduler then finishes it as if the model had produced eos.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from radixlm.constrained.bitmask import (GrammarMask, apply_grammar_mask, greedy_under_grammar, select_allowed_lists,
                                         without_rows)
from radixlm.runtime.sampling.logprobs import token_logprobs
from radixlm.runtime.sampling.penalties import apply_processors
from radixlm.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """One row of the batch = one running request."""

    params: SamplingParams
    prompt_ids: list[int]  # for repetition_penalty (HF semantics over prompt + output)
    output_ids: list[int]  # tokens generated so far (frequency/presence penalties, min_new_tokens)
    generator: torch.Generator | None  # per-request RNG from params.sampling_seed; None = global RNG
    # bool [V]: allowed tokens (None = all allowed). The scheduler passes grammar masks to the Sampler as
    # one batch GrammarMask instead (packed / id-list layouts, see constrained/bitmask.py).
    allowed_mask: torch.Tensor | None = None
    wants_logprob: bool = True  # False: the sampler skips this row's logprob (SampleOutput holds None)


@dataclass
class SampleOutput:
    token_ids: list[int]  # sampled token per row
    logprobs: list[float | None]  # log_softmax of the RAW logits row at the sampled token (None: not wanted)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [B, W] -> int64 [B], as x.argmax(dim=-1) (first maximum; NaN counts as the maximum). For fp32 on
    the CPU through numpy, whose argmax is vectorised and torch's is not: on a 49k-token row 10 vs 117 us,
    at 32 rows 0.46 vs 1.9 ms (measured on the development machine)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(np.argmax(x.numpy(), axis=-1).astype(np.int64, copy=False))
    return x.argmax(dim=-1)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded with `seed` that the request keeps across steps; None when unseeded."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def support_mask(logits: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor,
                 num_candidates: int = 1024) -> torch.Tensor:
    """logits [F, W] (already divided by temperature) -> bool [F, W]: the tokens that top_k, then top_p,
    then min_p keep: the same support as HF's TopK -> TopP -> MinP warpers."""
    return logits >= support_threshold(logits, top_ks, top_ps, min_ps, num_candidates)


def support_threshold(logits: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor,
                      num_candidates: int = 1024, log_norm: torch.Tensor | None = None) -> torch.Tensor:
    """logits [F, W] -> threshold [F, 1]: the filters keep exactly the tokens with logit >= threshold.

    top_ks [F] int64 in [1, W] (W = off), top_ps [F] float (>= 1 = off), min_ps [F] float (0 = off).
    top_k keeps every token tied with the k-th logit (as HF does). top_p keeps the smallest prefix whose
    mass in the top-k-renormalised distribution reaches top_p. min_p keeps p >= min_p * p_max.
    Each filter keeps a prefix of the descending order, so together they keep "logit >= threshold".
    Sorting a 49k row is the slow part, so we look for the threshold among the top `num_candidates`
    values first and sort whole rows only where the kept prefix does not end there.
    A token tied with the threshold is kept (HF's choice among exact ties is arbitrary).
    `log_norm` [F, 1] = logsumexp of each row, when the caller has it already.
    """
    width = logits.shape[-1]
    if log_norm is None:
        log_norm = torch.logsumexp(logits, dim=-1, keepdim=True)
    num_candidates = min(num_candidates, width)
    threshold, complete = _threshold(_top_values(logits, num_candidates), log_norm, top_ks, top_ps, min_ps,
                                     width)
    if not bool(complete.all()):
        redo = torch.nonzero(~complete).view(-1)
        threshold[redo], _ = _threshold(_top_values(logits[redo], width), log_norm[redo], top_ks[redo],
                                        top_ps[redo], min_ps[redo], width)
    return threshold


def _threshold(values: torch.Tensor, log_norm: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor,
               min_ps: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """values [F, C] largest logits, descending -> (threshold [F, 1], complete [F] bool).

    complete is False where the answer may lie past the C candidates (always True when C == width).
    """
    num_values = values.shape[-1]
    probs = (values - log_norm).exp()  # [F, C] true probabilities, non-increasing
    top_k_active = top_ks < width
    in_top_k = values >= values.gather(1, (top_ks.clamp(max=num_values) - 1).unsqueeze(1))
    kept_probs = probs * in_top_k
    cumulative = kept_probs.cumsum(dim=-1)  # non-decreasing
    # Mass that top_p renormalises by: the top-k set's (it ends inside the candidates unless the last
    # candidate is still in it, and then the row is redone in full), or 1 without top_k.
    mass = torch.where(in_top_k[:, -1:], torch.ones_like(log_norm), cumulative[:, -1:])
    # Exclusive prefix mass < top_p * mass  <=>  the token is still needed to reach top_p.
    keep = in_top_k & ((cumulative - kept_probs) < top_ps.unsqueeze(1) * mass)
    keep &= (probs >= min_ps.unsqueeze(1) * probs[:, :1]) & (values > float("-inf"))
    keep[:, 0] = True  # the most likely token always survives (also under float rounding)
    num_kept = keep.sum(dim=-1, keepdim=True)  # keep is a prefix: every condition is monotone
    complete = ~keep[:, -1] & ~(in_top_k[:, -1] & top_k_active)
    if num_values == width:
        complete = torch.ones_like(complete)
    return values.gather(1, num_kept - 1), complete


def _top_values(x: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` largest values of each row, descending ([F, count]).

    On CPU numpy's partition + SIMD sort beat torch.topk / torch.sort by 5-20x for 49k-wide rows
    (benchmarks/bench_sampler.py); on accelerators torch's own kernels are the fast ones.
    """
    width = x.shape[-1]
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # numpy has no bfloat16
    if x.device.type != "cpu":
        if count == width:
            return torch.sort(x, dim=-1, descending=True).values
        return torch.topk(x, count, dim=-1, sorted=True).values
    array = x.detach().numpy()
    if count < width:
        array = np.partition(array, width - count, axis=-1)[:, width - count:]
    # .copy(), not ascontiguousarray: a [F, 1] reversed view counts as contiguous and keeps its negative
    # stride, which torch refuses (a one-token allowed list with top_p hit it).
    return torch.from_numpy(np.sort(array, axis=-1)[:, ::-1].copy())


def _zero_below(weights: torch.Tensor, logits: torch.Tensor, threshold: torch.Tensor) -> None:
    """weights := 0 where logits < threshold (the filters' cut), in place. On the CPU as a numpy multiply
    by the kept mask: torch's bool compare + masked_fill_ over [32, 49k] took 4.5 ms here, this ~1 ms
    (weights are finite, so w * 1 == w and w * 0 == 0 exactly)."""
    if weights.is_cpu and weights.dtype == logits.dtype == torch.float32 and weights.is_contiguous():
        w = weights.numpy()
        np.multiply(w, logits.numpy() >= threshold.numpy(), out=w)
    else:
        weights.masked_fill_(logits < threshold, 0.0)


def _uses_filter(params: SamplingParams, width: int) -> bool:
    return 1 < params.top_k < width or params.top_p < 1.0 or params.min_p > 0.0


def _block_shape(width: int, max_block: int = 1024) -> tuple[int, int]:
    """(num_blocks, block_len) covering `width` with blocks of at most `max_block` (49152 -> 48 x 1024)."""
    num_blocks = -(-width // max_block)
    return num_blocks, -(-width // num_blocks)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """probs [S, num_blocks * block_len] (>= 0, any scale; zeros never chosen), uniforms [S] in [0, 1)
    -> ids [S].

    Picks the first token whose cumulative mass exceeds u * total, in two levels: the block by the
    cumulative block masses (float32 block sums, float64 running sum), then the token by the float64
    cumulative sum inside that one block, so no [S, V] cumulative sum is ever built.
    """
    num_rows = probs.shape[0]
    blocks = probs.view(num_rows, num_blocks, -1)  # [S, NB, BL]
    block_mass = blocks.sum(dim=-1).double()  # [S, NB]; float32 sums: a float64 copy would cost a pass
    block_cdf = block_mass.cumsum(dim=-1)
    # u <= 1 - 2**-24, so the target stays below the total and `right=True` (first cdf > target) always
    # lands on a block, then a token, with mass > 0.
    targets = uniforms.to(torch.float64).unsqueeze(1) * block_cdf[:, -1:]  # [S, 1]
    block = torch.searchsorted(block_cdf, targets, right=True).clamp_(max=num_blocks - 1)  # [S, 1]
    # Mass still to cover inside the block; >= 0 up to rounding, and a negative value would select a
    # leading zero-mass token.
    remaining = (targets - (block_cdf.gather(1, block) - block_mass.gather(1, block))).clamp_(min=0.0)
    inner_cdf = blocks[torch.arange(num_rows, device=probs.device), block.view(-1)].cumsum(
        dim=-1, dtype=torch.float64)  # [S, BL]
    # Summation order differs between the two levels; keep the target inside this block's mass so the
    # search ends on the block's last token with p > 0 at worst, never on a zero-mass one.
    remaining = torch.minimum(remaining, inner_cdf[:, -1:] * (1 - 1e-12))
    inner = torch.searchsorted(inner_cdf, remaining, right=True)
    return (block * blocks.shape[-1] + inner).view(-1)


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]):
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.fallback_id = min(self.eos_token_ids) if self.eos_token_ids else 0

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow], grammar: GrammarMask | None = None
                 ) -> SampleOutput:
        """logits [B, V] float32 (V >= vocab_size; extra columns are padding) -> one token per row.
        grammar: the batch's grammar masks (the scheduler's per-step layout), applied after the processors."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(rows)} rows")
        work = self._vocab_view(logits)
        processed = apply_processors(work, rows, self.eos_token_ids)  # (bool allowed_masks last)
        decided: dict[int, int] = {}
        if grammar is not None:
            greedy = [row.params.is_greedy for row in rows]
            decided, grammar = greedy_under_grammar(work if processed is None else processed, greedy, grammar)
            if grammar is not None and not all(greedy):
                grammar = self._sample_allowed_lists(work if processed is None else processed, rows, grammar,
                                                     decided)
        if grammar is not None:  # masking last: -inf stays -inf under every processor
            processed = apply_grammar_mask(work, processed, grammar)
        source = work if processed is None else processed
        if not decided:
            token_ids = self._pick(source, rows, processed is not None).tolist()
        elif len(decided) == len(rows):
            token_ids = [decided[i] for i in range(len(rows))]  # no tensor: a torch call costs us here
        else:  # only the rows left: a decided sampled row must not draw again (its seed's sequence)
            rest = [i for i in range(len(rows)) if i not in decided]
            index = torch.tensor(rest, dtype=torch.long, device=source.device)
            chosen = self._pick(source.index_select(0, index), [rows[i] for i in rest], processed is not None)
            token_ids = [0] * len(rows)
            for i, token in (*zip(rest, chosen.tolist()), *decided.items()):
                token_ids[i] = token
        return SampleOutput(token_ids=token_ids, logprobs=self._logprobs(logits, token_ids, rows))

    def _pick(self, source: torch.Tensor, rows: list[SamplingRow], processed: bool) -> torch.Tensor:
        if not processed and all(row.params.is_greedy for row in rows):
            return argmax_rows(source)  # fast path: one reduction, no [B, V] copy
        return self._choose(source, rows, processed)

    def _sample_allowed_lists(self, source: torch.Tensor, rows: list[SamplingRow], grammar: GrammarMask,
                              decided: dict[int, int]) -> GrammarMask | None:
        """Sampled rows whose mask is an allowed-id list draw from their allowed logits alone (into
        `decided`): the same distribution as the masked row (blocked tokens have p = 0; ids are sorted,
        so the inverse CDF runs in the same token order), without a 49k-wide mask, softmax and filter.
        Returns the mask of the rows left (None when none is)."""
        lists = select_allowed_lists(source, [not row.params.is_greedy for row in rows], grammar)
        for i, values, ids in lists:
            if np.isfinite(values).any():  # dead rows are left to the full path (eos)
                decided[i] = ids.item(int(self._sample(torch.from_numpy(values).unsqueeze(0), [rows[i]])))
        return without_rows(grammar, decided)

    @staticmethod
    def _logprobs(logits: torch.Tensor, token_ids: list[int], rows: list[SamplingRow]) -> list[float | None]:
        """The raw logprob of each row's token, for the rows that want it (None elsewhere): a full-row
        log-normaliser costs ~130 us per 49k-token row here (2 ms at 32 rows), every step."""
        want = [i for i, row in enumerate(rows) if row.wants_logprob]
        if not want:
            return [None] * len(rows)
        if len(want) == len(rows):
            return token_logprobs(logits, torch.tensor(token_ids)).tolist()
        index = torch.tensor(want, dtype=torch.long, device=logits.device)
        values = token_logprobs(logits.index_select(0, index), torch.tensor([token_ids[i] for i in want])).tolist()
        out: list[float | None] = [None] * len(rows)
        for i, value in zip(want, values):
            out[i] = value
        return out

    def processed_logits(self, logits: torch.Tensor, rows: list[SamplingRow], grammar: GrammarMask | None = None
                         ) -> torch.Tensor:
        """[B, vocab_size] logits after bias, penalties, min_new_tokens and masks (before temperature):
        what greedy takes the argmax of. A view of `logits` when no row needs processing; with `grammar` on
        the CPU, the mask builder's buffer, rewritten by its next step."""
        work = self._vocab_view(logits)
        processed = self._process(work, rows, grammar)
        return work if processed is None else processed

    def _process(self, work: torch.Tensor, rows: list[SamplingRow], grammar: GrammarMask | None
                 ) -> torch.Tensor | None:
        processed = apply_processors(work, rows, self.eos_token_ids)  # (bool allowed_masks last)
        if grammar is not None:  # masking last, as apply_processors does: -inf stays -inf under them all
            processed = apply_grammar_mask(work, processed, grammar)
        return processed

    def _vocab_view(self, logits: torch.Tensor) -> torch.Tensor:
        work = logits if logits.shape[-1] <= self.vocab_size else logits[:, : self.vocab_size]  # a view
        return work if work.dtype == torch.float32 else work.float()

    def _choose(self, work: torch.Tensor, rows: list[SamplingRow], may_be_dead: bool) -> torch.Tensor:
        """work [B, W] processed logits -> token ids [B] (int64). `may_be_dead`: processors ran, so a
        row may be all -inf (raw model logits are finite)."""
        device = work.device
        # amax vectorises well (argmax does not): find dead rows before any NaN can appear.
        alive = torch.isfinite(work.amax(dim=-1)).tolist() if may_be_dead else [True] * len(rows)
        token_ids = torch.full((len(rows),), self.fallback_id, dtype=torch.long, device=device)
        greedy = [i for i, r in enumerate(rows) if alive[i] and r.params.is_greedy]
        sampled = [i for i, r in enumerate(rows) if alive[i] and not r.params.is_greedy]
        if len(greedy) == len(rows):
            token_ids = argmax_rows(work)
        elif greedy:
            index = torch.tensor(greedy, dtype=torch.long, device=device)
            token_ids[index] = argmax_rows(work.index_select(0, index))
        if sampled:
            index = torch.tensor(sampled, dtype=torch.long, device=device)
            token_ids[index] = self._sample(work.index_select(0, index), [rows[i] for i in sampled])
        return token_ids

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """logits [S, W] (a private copy, edited in place) -> sampled ids [S]."""
        device, width = logits.device, logits.shape[-1]
        num_blocks, block_len = _block_shape(width)
        if num_blocks * block_len > width:  # pad with -inf (p = 0) to whole blocks
            logits = F.pad(logits, (0, num_blocks * block_len - width), value=float("-inf"))
        temperature = torch.tensor([r.params.temperature for r in rows], dtype=logits.dtype, device=device)
        logits.div_(temperature.unsqueeze(1))
        row_max = logits.amax(dim=-1, keepdim=True)  # finite: dead rows never get here
        weights = torch.sub(logits, row_max).exp_()  # [S, P] unnormalised probabilities, 0 at -inf
        filtered = [j for j, r in enumerate(rows) if _uses_filter(r.params, width)]
        if filtered:
            log_norm = row_max + weights.sum(dim=-1, keepdim=True).log()  # logsumexp, reusing weights
            threshold = self._thresholds(logits[:, :width], rows, filtered, log_norm)
            _zero_below(weights, logits, threshold)
        return inverse_cdf_sample(weights, self._uniforms(rows, device), num_blocks)

    @staticmethod
    def _thresholds(logits: torch.Tensor, rows: list[SamplingRow], filtered: list[int], log_norm: torch.Tensor
                    ) -> torch.Tensor:
        """Per-row filter thresholds [S, 1] (-inf for rows without a filter)."""
        device, width = logits.device, logits.shape[-1]
        params = [rows[j].params for j in filtered]
        top_ks = torch.tensor([p.top_k if 1 <= p.top_k <= width else width for p in params], device=device)
        top_ps = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params], dtype=logits.dtype, device=device)
        min_ps = torch.tensor([p.min_p for p in params], dtype=logits.dtype, device=device)
        threshold = torch.full((len(rows), 1), float("-inf"), dtype=logits.dtype, device=device)
        if len(filtered) == len(rows):
            threshold[:] = support_threshold(logits, top_ks, top_ps, min_ps, log_norm=log_norm)
        else:
            index = torch.tensor(filtered, dtype=torch.long, device=device)
            threshold[index] = support_threshold(logits.index_select(0, index), top_ks, top_ps, min_ps,
                                                 log_norm=log_norm[index])
        return threshold

    @staticmethod
    def _uniforms(rows: list[SamplingRow], device: torch.device) -> torch.Tensor:
        """One U[0, 1) float32 per row: a seeded row from its own generator (so its draws do not depend
        on the batch), the other rows in one draw from the global RNG."""
        uniforms = torch.rand(len(rows), device=device)
        for j, row in enumerate(rows):
            if row.generator is not None:
                uniforms[j] = torch.rand(1, generator=row.generator, device=row.generator.device).item()
        return uniforms
