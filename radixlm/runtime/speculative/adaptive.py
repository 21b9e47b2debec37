"""Per-request adaptive draft length: speculation that is not paying turns itself down, then off a while.

Runs in the scheduler process. A verify row of 1 + k tokens costs more than a 1-token decode row (on
a CPU noticeably), so a request whose proposals keep being rejected would be slower than plain
decode. Each request keeps an exponential average of its acceptance rate (accepted / proposed per
step): below `min_acceptance` its draft length halves; at 1 it stops proposing for a cool-down that
doubles each time it is re-entered (a request whose text does not repeat quickly ends up speculating
almost never). Good acceptance grows the length back to the maximum. During a pause a strong n-gram
match (tuning.strong_match) is still proposed (a lookup costs no forward); if it is accepted, the
pause ends.

It also estimates the chance that the request's next draft is accepted at all (its first token):
decayed counts of its drafts' first tokens, with one pseudo-draft accepted at first_prior (a request
with no history); the controller proposes a draft only where this chance pays for the draft's place
in the step (cost.py). Steps without a proposal cost no forward, but their lookups cost the host: in
a large step a request whose last dry_lookups lookups gave no verified draft (free text) skips its
lookups a while.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.speculative.tuning import TUNING as T


@dataclass
class AdaptiveState:
    k: int  # current draft length
    acceptance: float = 0.5  # the first proposals are tried at full length; two misses turn k down
    cooldown: int = 0  # steps left without proposals
    next_cooldown: int = T.first_cooldown
    first_hits: float = 0.0  # drafts whose first token was accepted (decayed by first_decay per draft)
    first_tries: float = 0.0  # drafts verified (decayed alike)
    streak: int = 0  # consecutive drafts accepted whole (a request copying long runs)
    missed: bool = False  # its last draft had no token accepted
    dry_lookups: int = 0  # consecutive large-step lookups that gave no verified draft
    skip: int = 0  # large steps left without lookups
    next_skip: int = T.dry_skip

    def first_chance(self) -> float:
        """The estimated probability that the next draft's first token is accepted."""
        return (self.first_hits + T.first_prior) / (self.first_tries + 1.0)

    def dry(self) -> bool:
        """Whether this large step skips the request's lookup (counting the skip down)."""
        if self.skip > 0:
            self.skip -= 1
            return True
        return False

    def looked_up(self, found: bool) -> None:
        """A large step's lookup for this request gave a draft that is verified, or not."""
        if found:
            self.dry_lookups, self.next_skip = 0, T.dry_skip
            return
        self.dry_lookups += 1
        if self.dry_lookups >= T.dry_lookups:
            self.skip, self.dry_lookups = self.next_skip, 0
            self.next_skip = min(T.dry_max_skip, 2 * self.next_skip)

    def wants_proposal(self) -> bool:
        if self.cooldown > 0:
            self.cooldown -= 1
            return False
        return True

    def update(self, proposed: int, accepted: int, max_k: int, min_acceptance: float) -> None:
        if proposed <= 0:
            return
        self.first_hits = T.first_decay * self.first_hits + (accepted > 0)
        self.first_tries = T.first_decay * self.first_tries + 1.0
        self.streak = self.streak + 1 if accepted == proposed else 0
        self.missed = accepted == 0
        if self.cooldown > 0:  # a strong match proposed during a pause (tuning.strong_match)
            if 2 * accepted >= proposed:  # it paid: the text repeats now, resume at the length that worked
                self.cooldown, self.acceptance = 0, T.grow_above
                self.k = max(1, min(max_k, accepted))
            return
        self.acceptance = (1 - T.ema_weight) * self.acceptance + T.ema_weight * (accepted / proposed)
        if self.acceptance >= min_acceptance:
            if self.acceptance > T.grow_above and self.k < max_k:
                self.k += 1
            if accepted == proposed:
                self.next_cooldown = T.first_cooldown  # a streak that pays resets the back-off
            return
        if self.k > 1:
            self.k = max(1, self.k // 2)
            return
        self.cooldown = self.next_cooldown
        self.next_cooldown = min(T.max_cooldown, 2 * self.next_cooldown)
        self.acceptance = min_acceptance  # after the pause, one bad step turns it off again
