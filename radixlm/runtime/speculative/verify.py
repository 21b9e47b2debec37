"""Exact verification of one draft token against the target model's distribution at its position.

Runs in the scheduler process. Standard speculative rejection sampling: a draft token x drawn from a
proposal distribution q is accepted with probability min(1, p(x) / q(x)), and on rejection the token
is drawn from max(0, p - q) renormalised; the emitted token then follows p exactly, whatever q is.
The n-gram proposer (and the draft model for a greedy request) is deterministic given the context: q
is a point mass on x, acceptance is p(x), and the residual is p with x removed. For a sampled
request the draft model samples x from its own distribution q (`draft_probs`: its logits at the
request's temperature and top-k / top-p / min-p), which is accepted far more often than its argmax
would be. p is the distribution the plain sampler draws from: the processed logits (logit_bias,
penalties, min_new_tokens, grammar mask, the Sampler's `processed_logits`), divided by the
temperature, cut by top_k -> top_p -> min_p (the same `support_threshold` the Sampler uses). Greedy
rows never come here: their token is the Sampler's own argmax, accepted iff it equals the draft (so
greedy output is token-identical with speculation off).
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
    return _filtered_weights((processed - top) / row.params.temperature, row.params)


def draft_probs(logits: torch.Tensor, params) -> torch.Tensor:
    """A draft model's logits [V] -> its normalised float64 proposal distribution q for a sampled request:
    the request's temperature and top-k / top-p / min-p (penalties and grammar are the target's alone)."""
    logits = logits.double()
    weights = _filtered_weights((logits - logits.max()) / params.temperature, params)
    return weights / weights.sum()


def _filtered_weights(scaled: torch.Tensor, p) -> torch.Tensor:
    """exp(scaled) [W] (max 0) with the tokens the request's top-k / top-p / min-p cut set to 0."""
    weights = scaled.exp()
    width = scaled.shape[-1]
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


def sample_draft(q: torch.Tensor, generator: torch.Generator | None) -> int:
    """A draft token drawn from q (the request's own generator: reproducible with sampling_seed)."""
    u = torch.rand(1, generator=generator, device=generator.device) if generator is not None else torch.rand(1)
    return sample_weights(q, float(u.item()))


def verify_sampled(sampler: Sampler, logits: torch.Tensor, row: SamplingRow, mask: GrammarMask | None,
                   draft: int, q: torch.Tensor | None = None) -> tuple[int, bool]:
    """(emitted token, whether it is the accepted draft) for a sampled (temperature > 0) row; q: the
    distribution the draft was sampled from ([V] normalised), None for a deterministic proposal."""
    weights = target_weights(sampler, logits, row, mask)
    if weights is None:
        return sampler.fallback_id, sampler.fallback_id == draft
    if q is not None:
        return _verify_against(weights, q, row, draft)
    total = float(weights.sum())
    p_draft = float(weights[draft]) / total if 0 <= draft < weights.numel() else 0.0
    if uniform(row) < p_draft:
        return draft, True
    if 0 <= draft < weights.numel():
        weights[draft] = 0.0  # the residual max(0, p - q): p without the draft token
    if float(weights.sum()) <= 0.0:  # p was a point mass on the draft and u hit 1.0: cannot happen for u < 1
        return draft, True
    return sample_weights(weights, uniform(row)), False


def _verify_against(weights: torch.Tensor, q: torch.Tensor, row: SamplingRow, draft: int) -> tuple[int, bool]:
    p = weights / weights.sum()
    q_full = torch.zeros_like(p)
    width = min(q.numel(), p.numel())
    q_full[:width] = q[:width].to(p.dtype)
    q_draft = float(q_full[draft]) if 0 <= draft < p.numel() else 0.0
    if q_draft > 0.0 and uniform(row) * q_draft < float(p[draft]):  # u < p(x) / q(x)
        return draft, True
    residual = (p - q_full).clamp_(min=0.0)
    if float(residual.sum()) <= 0.0:  # p <= q everywhere means p == q: a rejection has probability 0
        residual = p
    return sample_weights(residual, uniform(row)), False
