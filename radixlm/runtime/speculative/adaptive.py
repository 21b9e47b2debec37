"""Per-request adaptive draft length: speculation that is not paying turns itself down, then off a while.

Runs in the scheduler process. A verify row of 1 + k tokens costs more than a 1-token decode row (on a CPU
noticeably: docs/benchmarks.md), so a request whose proposals keep being rejected would be slower than
plain decode. Each request keeps an exponential average of its acceptance rate (accepted / proposed per
step): below `min_acceptance` its draft length halves; at 1 it stops proposing for a cool-down that doubles
each time it is re-entered (a request whose text does not repeat quickly ends up speculating almost never).
Good acceptance grows the length back to the maximum. Steps without a proposal cost no forward, but
their lookups cost the host, so in large steps lookups that keep giving nothing back off (DRY_LOOKUPS).
During a pause an n-gram match of 6+ tokens is still proposed (a lookup costs no forward); if it is
accepted, the pause ends.
"""

from __future__ import annotations

from dataclasses import dataclass

EMA_WEIGHT = 0.3  # weight of the latest step in the acceptance average
GROW_ABOVE = 0.6  # average acceptance above which the draft length grows by one
FIRST_COOLDOWN = 8  # decode steps without speculation after the first turn-off
MAX_COOLDOWN = 256
# The chance that a request's next draft is accepted at all (its first token): decayed counts of its
# drafts' first tokens, with one pseudo-draft accepted at FIRST_PRIOR (a request with no history). The
# controller proposes a draft only where this chance pays for the draft's place in the step (cost.py).
# 0.5: above what a step of 16 rows asks (0.35), so a new request drafts at any batch; one miss puts it
# below (0.25) at 8+ rows (replayed free text at batch 16: 221 -> 89 draft tokens; prior 0.6 or 0.7: 134).
FIRST_PRIOR = 0.5
FIRST_DECAY = 0.8
# In a step of many rows (controller.LARGE_BATCH), a request whose last DRY_LOOKUPS lookups gave no draft
# that was verified (free text: no match, or a match too weak to keep) skips its lookups for DRY_SKIP
# steps, doubling up to DRY_MAX_SKIP while they stay dry: on a GPU a 16-row decode step takes ~3 ms, and
# the lookups of 16 such requests cost the host a tenth of that every step (docs/benchmarks.md, "GPU").
DRY_LOOKUPS = 8
DRY_SKIP = 8
DRY_MAX_SKIP = 64


@dataclass
class AdaptiveState:
    k: int  # current draft length
    acceptance: float = 0.5  # the first proposals are tried at full length; two misses turn k down
    cooldown: int = 0  # steps left without proposals
    next_cooldown: int = FIRST_COOLDOWN
    first_hits: float = 0.0  # drafts whose first token was accepted (decayed by FIRST_DECAY per draft)
    first_tries: float = 0.0  # drafts verified (decayed alike)
    streak: int = 0  # consecutive drafts accepted whole (a request copying long runs)
    missed: bool = False  # its last draft had no token accepted
    dry_lookups: int = 0  # consecutive large-step lookups that gave no verified draft
    skip: int = 0  # large steps left without lookups
    next_skip: int = DRY_SKIP

    def first_chance(self) -> float:
        """The estimated probability that the next draft's first token is accepted."""
        return (self.first_hits + FIRST_PRIOR) / (self.first_tries + 1.0)

    def dry(self) -> bool:
        """Whether this large step skips the request's lookup (counting the skip down)."""
        if self.skip > 0:
            self.skip -= 1
            return True
        return False

    def looked_up(self, found: bool) -> None:
        """A large step's lookup for this request gave a draft that is verified, or not."""
        if found:
            self.dry_lookups, self.next_skip = 0, DRY_SKIP
            return
        self.dry_lookups += 1
        if self.dry_lookups >= DRY_LOOKUPS:
            self.skip, self.dry_lookups = self.next_skip, 0
            self.next_skip = min(DRY_MAX_SKIP, 2 * self.next_skip)

    def wants_proposal(self) -> bool:
        if self.cooldown > 0:
            self.cooldown -= 1
            return False
        return True

    def update(self, proposed: int, accepted: int, max_k: int, min_acceptance: float) -> None:
        if proposed <= 0:
            return
        self.first_hits = FIRST_DECAY * self.first_hits + (accepted > 0)
        self.first_tries = FIRST_DECAY * self.first_tries + 1.0
        self.streak = self.streak + 1 if accepted == proposed else 0
        self.missed = accepted == 0
        if self.cooldown > 0:  # a strong match proposed during a pause (controller.STRONG_MATCH)
            if 2 * accepted >= proposed:  # it paid: the text repeats now, resume at the length that worked
                self.cooldown, self.acceptance = 0, GROW_ABOVE
                self.k = max(1, min(max_k, accepted))
            return
        self.acceptance = (1 - EMA_WEIGHT) * self.acceptance + EMA_WEIGHT * (accepted / proposed)
        if self.acceptance >= min_acceptance:
            if self.acceptance > GROW_ABOVE and self.k < max_k:
                self.k += 1
            if accepted == proposed:
                self.next_cooldown = FIRST_COOLDOWN  # a streak that pays resets the back-off
            return
        if self.k > 1:
            self.k = max(1, self.k // 2)
            return
        self.cooldown = self.next_cooldown
        self.next_cooldown = min(MAX_COOLDOWN, 2 * self.next_cooldown)
        self.acceptance = min_acceptance  # after the pause, one bad step turns it off again
