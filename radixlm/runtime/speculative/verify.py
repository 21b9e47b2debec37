"""Exact verification of one draft token against the target model's distribution at its position.

Runs in the scheduler process. The proposers are deterministic given the context, so the proposal
distribution q is a point mass on the draft token x. Standard speculative rejection sampling then accepts
x with probability min(1, p(x) / q(x)) = p(x), and on rejection samples from max(0, p - q) renormalised,
which is p with x removed. The emitted token therefore follows p exactly, where p is the distribution the
plain sampler draws from: the processed logits (logit_bias, penalties, min_new_tokens, grammar mask, the
Sampler's `processed_logits`), divided by the temperature, cut by top_k -> top_p -> min_p (the same
`support_threshold` the Sampler uses). Greedy rows never come here: their token is the Sampler's own
argmax, accepted iff it equals the draft (so greedy output is token-identical with speculation off).
"""

from __future__ import annotations

import torch

from radixlm.constrained.bitmask import GrammarMask
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow, support_threshold


def target_weights(sampler: Sampler, logits: torch.Tensor, row: SamplingRow, mask: GrammarMask | None
                   ) -> torch.Tensor | None:
    """logits [1, V] raw -> unnormalised float64 probabilities [W] of the sampled distribution, or None
    for a dead row (every token masked)."""
    processed = sampler.processed_logits(logits, [row], mask)[0].double()
    top = processed.max()
    if not torch.isfinite(top):
        return None
    scaled = (processed - top) / row.params.temperature
    weights = scaled.exp()
    p, width = row.params, scaled.shape[-1]
    if 1 < p.top_k < width or p.top_p < 1.0 or p.min_p > 0.0:
        top_k = torch.tensor([p.top_k if 1 <= p.top_k <= width else width])
        top_p = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0], dtype=scaled.dtype)
        threshold = support_threshold(scaled.unsqueeze(0), top_k, top_p, torch.tensor([p.min_p], dtype=scaled.dtype))
        weights = torch.where(scaled >= threshold[0], weights, torch.zeros_like(weights))
    return weights


def uniform(row: SamplingRow) -> float:
    if row.generator is not None:
        return float(torch.rand(1, generator=row.generator, device=row.generator.device).item())
    return float(torch.rand(1).item())


def sample_weights(weights: torch.Tensor, u: float) -> int:
    """Inverse CDF over unnormalised weights (zeros are never chosen)."""
    cdf = torch.cumsum(weights, dim=0)
    target = torch.tensor([u * float(cdf[-1]) * (1 - 1e-12)], dtype=cdf.dtype)
    return int(torch.searchsorted(cdf, target, right=True).clamp_(max=weights.numel() - 1))


def verify_sampled(sampler: Sampler, logits: torch.Tensor, row: SamplingRow, mask: GrammarMask | None,
                   draft: int) -> tuple[int, bool]:
    """(emitted token, whether it is the accepted draft) for a sampled (temperature > 0) row."""
    weights = target_weights(sampler, logits, row, mask)
    if weights is None:
        return sampler.fallback_id, sampler.fallback_id == draft
    total = float(weights.sum())
    p_draft = float(weights[draft]) / total if 0 <= draft < weights.numel() else 0.0
    if uniform(row) < p_draft:
        return draft, True
    if 0 <= draft < weights.numel():
        weights[draft] = 0.0  # the residual max(0, p - q): p without the draft token
    if float(weights.sum()) <= 0.0:  # p was a point mass on the draft and u hit 1.0: cannot happen for u < 1
        return draft, True
    return sample_weights(weights, uniform(row)), False
