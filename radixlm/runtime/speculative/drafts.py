"""The records the controller and its proposers pass each other: what to look up, and what was drafted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from radixlm.runtime.scheduler.request import Req


@dataclass(frozen=True, slots=True)
class Lookup:
    """One request the controller asks its proposer for a draft this step."""

    req: Req
    k: int  # draft tokens asked for
    priced_k: int  # what a step that prices draft tokens allows (tuning.large_batch_max_draft)
    copying: bool  # its drafts are being accepted: an n-gram proposer accepts a shorter match
    strong_only: bool  # paused, or alone and unlikely: only a strong match (tuning.strong_match) is kept


@dataclass(frozen=True, slots=True)
class Draft:
    """A proposer's draft for one request."""

    tokens: list[int]
    match: int = 0  # length of the suffix match it continues (0: not an n-gram)
    q: torch.Tensor | None = None  # distributions [k, V] the tokens were sampled from (None: deterministic)
    keep: int = 0  # how many tokens to keep where each costs the step's forward its compute


NO_DRAFT = Draft([])
