"""SpecController: what the scheduler asks of speculative decoding (the hooks stay a few lines there).

Runs in the scheduler process. Per step: `propose` gives each decoding request its draft tokens
(bounded by max_new_tokens, the context, the grammar, the request's stops (stop_cut.py) and its
adaptive draft length; none where the step's size makes the draft unlikely to pay, cost.py); the
scheduler turns a request with a draft into one extend row [last token, d1..dk] and the
OutputProcessor verifies it (verify.py); `on_verified` feeds the adaptive state and the counters;
`on_finish` drops the request's state, and the proposer's (a finished sequence goes to the
cross-request n-gram corpus) at once for an abort, at `settle` for a request finished in a step
(after the next launches, or once idle). Every running request (also one still prefilling) is shown
to the proposer (`observe`, which the scheduler calls right after launching each step), so an n-gram
proposal can continue the text of another request running now (ngram.LiveNgrams). The NGRAM proposer
is ngram_proposer.py.

Why the rules below (their numbers are in tuning.py):
  - Copying: a request whose drafts are being accepted is copying text (values from a record into
    JSON), and right after a copied value starts only its last token matches the source, so a
    1-token match is proposed for it; in free text short matches are mostly wrong. In a large step a
    request whose last draft had no token accepted is not copying: a copy that has just ended would
    go on proposing short matches nobody accepts while its average decays.
  - Large steps (tuning.large_batch+ rows) are compute-bound and a closed batch runs as long as its
    slowest request: drafts are capped (large_batch_max_draft) unless the request is on a streak of
    drafts accepted whole, and a step verifies drafts only where they are expected to pay for it
    (_step_pays); otherwise only requests on a streak, and fresh requests where enough of them draft
    (_explores), keep theirs.
  - PADDED: where a step's verify forward pads every row to 1 + speculative_num_draft_tokens tokens
    (CUDA's verify graphs, model/verify_graph.py: up to `padded_rows` rows) the padding is computed
    whatever the drafts' lengths, so the cuts that price a draft token by its compute (the cap
    above, and the proposer's `keep`) would only lose accepted tokens: such a step verifies whole
    drafts. Whether it verifies at all is still decided on the cut drafts: a verify step costs the
    host more than a decode step.
  - One row: where a lone decoding row steps through the model in one call (the CPU's
    cpu_ops.decode_stack), a verify row takes the slower module path, so a lone draft must be likely
    (one_row_chance) or a strong match.
  - Settling: a finished request leaves the proposer after the next launch, where a GPU's step hides
    it, at most settle_tokens of its text a step (or 1/settle_spread of the backlog): a step that
    finishes many requests would otherwise spend more host time settling than the device spends on
    the step.
"""

from __future__ import annotations

from typing import Protocol

import torch

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.speculative.adaptive import AdaptiveState
from radixlm.runtime.speculative.cost import min_chance, min_expected
from radixlm.runtime.speculative.drafts import NO_DRAFT, Draft, Lookup
from radixlm.runtime.speculative.stats import SpecStats
from radixlm.runtime.speculative.stop_cut import StopCut
from radixlm.runtime.speculative.tuning import TUNING as T


class Proposer(Protocol):
    cheap: bool  # True: proposing costs no forward (asked even while paused, for strong matches only)

    def propose(self, reqs: list[Req], ks: list[int], copying: list[bool], large_batch: bool = False
                ) -> list[Draft]:
        """A draft per request, of at most its k tokens; copying: whether the request's drafts are being
        accepted (an n-gram proposer then accepts a shorter match); large_batch: the step has
        tuning.large_batch+ decoding rows (an n-gram proposer then wants a longer match from the others, and
        keeps fewer of a weak draft's tokens)."""

    def observe(self, reqs: list[Req]) -> None:
        """The running requests' tokens so far (after a step's launch, or before proposals without one)."""

    def on_verified(self, req: Req, proposed: int, accepted: int) -> None:
        """How many of req's draft tokens of this step were verified, and accepted."""

    def on_finish(self, req: Req) -> None: ...

    def flush(self) -> None: ...

    def check_integrity(self, idle: bool) -> None: ...


class SpecController:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, context_len: int,
                 stop_cut: StopCut | None = None, one_call_decode: bool = False, padded_rows: int = 0):
        self.config = config
        self.proposer = proposer
        self.context_len = context_len
        self.stop_cut = stop_cut  # None: drafts are not cut at the request's stops
        self.one_call_decode = one_call_decode  # a lone decode row runs the model in one call (one_row_chance)
        self.padded_rows = padded_rows  # steps of up to this many rows verify on padded rows (PADDED)
        self.max_k = config.max_draft
        self.cost_aware = T.cost_aware
        self.stats = SpecStats()
        self.observes_after_launch = False  # set by the first observe(): the scheduler indexes after launches
        self._finished: dict[str, Req] = {}  # finished in steps, not yet let go of by the proposer (settle)
        self._state: dict[str, AdaptiveState] = {}
        self._q: dict[str, torch.Tensor] = {}  # this step's sampled drafts' distributions (verify.py)

    def adaptive(self, rid: str) -> AdaptiveState:
        """The adaptive state of a decoding request (made at its first proposal)."""
        state = self._state.get(rid)
        if state is None:
            state = self._state[rid] = AdaptiveState(self.max_k)
        return state

    def propose(self, reqs: list[Req], running: list[Req] | None = None) -> list[list[int]]:
        """Draft tokens per decoding request ([] = a plain decode row); running: every running request
        (decoding or still prefilling), whose text proposals may continue."""
        large = len(reqs) >= T.large_batch
        # PADDED: the drafts' lengths cost this step's forward nothing (an n-gram's cost no forward either)
        padded = large and len(reqs) <= self.padded_rows and self.proposer.cheap
        lookups = self._choose(reqs, large)
        if large and self.cost_aware and not self._may_pay(lookups, len(reqs)):
            lookups = []  # _step_pays would drop every draft: no lookups (on a GPU the host's time is the step's)
        if not self.observes_after_launch:  # (once it does, observe shows the proposer every request first)
            shown = running if running is not None else reqs
            self._settle_clashes(shown)
            self.proposer.observe(shown)
        self._q.clear()
        if not lookups:  # nothing looked up (free text in a large step, mostly): no draft to cut or count
            return [[] for _ in reqs]
        found = self._ask(lookups, padded, large)
        out = self._step_drafts(reqs, found, padded, large)
        if large:  # a lookup whose draft is dropped (paused, not paying) was as dry as one that found nothing
            for req, tokens in zip(reqs, out):
                if req.rid in found:
                    self._state[req.rid].looked_up(bool(tokens))
        self._keep_distributions(reqs, found, out)
        return out

    def _ask(self, lookups: list[Lookup], padded: bool, large: bool) -> dict[str, tuple[Lookup, Draft]]:
        """The proposer's draft for each lookup, by rid (whole drafts asked where the step is PADDED)."""
        reqs = [lookup.req for lookup in lookups]
        ks = [lookup.k if padded else lookup.priced_k for lookup in lookups]
        drafts = self.proposer.propose(reqs, ks, [lookup.copying for lookup in lookups], large)
        return {lookup.req.rid: (lookup, draft) for lookup, draft in zip(lookups, drafts)}

    def _step_drafts(self, reqs: list[Req], found: dict[str, tuple[Lookup, Draft]], padded: bool, large: bool
                     ) -> list[list[int]]:
        """The drafts the step verifies: cut (_cut), kept in a large step only where they pay (_step_pays) or
        the request is on a streak or explored, and within speculative_max_batch_draft_tokens."""
        out, priced, uncut = self._cut(reqs, found, padded)
        if large and self.cost_aware and not self._step_pays(reqs, priced):
            explore = self._explores(reqs, uncut)
            out = [d if self._keeps(self._state[r.rid], explore) else [] for r, d in zip(reqs, out)]
        if self.config.speculative_max_batch_draft_tokens is not None:
            out = self._cap(reqs, out, self.config.speculative_max_batch_draft_tokens)
        return out

    def _choose(self, reqs: list[Req], large: bool) -> list[Lookup]:
        """The requests to look up this step, and how."""
        need = min_chance(len(reqs)) if self.cost_aware else 0.0
        lone = len(reqs) == 1 and self.one_call_decode and self.cost_aware
        lookups = []
        for req in reqs:
            lookup = self._lookup(req, self.adaptive(req.rid), large, need, lone)
            if lookup is not None:
                lookups.append(lookup)
        return lookups

    def _lookup(self, req: Req, state: AdaptiveState, large: bool, need: float, lone: bool) -> Lookup | None:
        """req's lookup, or None where it skips one: its lookups have been dry (adaptive.py), a draft is
        unlikely to pay for its verify tokens (need: the least first-token chance that does; lone: a one-call
        decode row, one_row_chance), or it has no room or is paused (and asking costs forwards)."""
        if large and state.dry():
            state.wants_proposal()  # a pause counts down in the steps its lookups skip as well
            return None
        k, active = self._budget(req, state)
        chance = state.first_chance()
        if chance < need:
            return None
        unlikely = lone and chance < T.one_row_chance
        cheap = self.proposer.cheap
        if (unlikely and not cheap) or k <= 0 or not (active or cheap):
            return None  # a draft model's proposal costs forwards, and only a strong n-gram match would stay
        priced_k = min(k, T.large_batch_max_draft) if large and state.streak < T.large_batch_streak else k
        copying = (active and req.num_spec_accepted > 0 and state.acceptance >= T.copying_acceptance
                   and not (large and state.missed))
        return Lookup(req, k, priced_k, copying, strong_only=not active or unlikely)

    def observe(self, running: list[Req]) -> None:
        """Index the running requests' text while the device runs the step just launched (the scheduler
        calls this after each launch): on a GPU the host's work is hidden there. From the first call on,
        propose leaves indexing to it, so at a proposal the newest token of a request that looks nothing
        up is not yet indexed (an n-gram continuing with it matters only where a token repeats itself)."""
        self.observes_after_launch = True
        self._settle_clashes(running)
        self.settle(budget=True)
        self.proposer.observe(running)

    def _cut(self, reqs: list[Req], found: dict[str, tuple[Lookup, Draft]], padded: bool
             ) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """Each request's draft as the step verifies it (the proposer's and the controller's cuts for a draft
        token's compute but where the step is PADDED, the grammar's and the stops'), what those cuts keep of
        it, and its length before the proposer's cuts (up to the step's cap: _explores's estimate)."""
        out, priced, uncut = [], [], []
        for req in reqs:
            lookup, draft = found.get(req.rid, (None, NO_DRAFT))
            cap = lookup.priced_k if lookup is not None else 0
            tokens = draft.tokens
            if lookup is not None and lookup.strong_only and draft.match < T.strong_match:
                tokens = []
            uncut.append(min(len(tokens), cap))
            tokens = self._allowed(req, tokens if padded else tokens[: draft.keep])
            out.append(tokens)
            priced.append(tokens[: min(draft.keep, cap)])
        return out, priced, uncut

    def _allowed(self, req: Req, tokens: list[int]) -> list[int]:
        """tokens up to where the request's grammar refuses one, or the request would stop."""
        if tokens and req.grammar is not None:
            tokens = _grammar_prefix(req.grammar, tokens)
        if tokens and self.stop_cut is not None:
            tokens = self.stop_cut.cut(req, tokens)
        return tokens

    def _keep_distributions(self, reqs: list[Req], found: dict[str, tuple[Lookup, Draft]],
                            out: list[list[int]]) -> None:
        """The distributions sampled drafts came from, as far as each is verified (draft_q)."""
        for req, tokens in zip(reqs, out):
            q = found[req.rid][1].q if req.rid in found else None
            if tokens and q is not None:
                self._q[req.rid] = q[: len(tokens)]

    def _explores(self, reqs: list[Req], uncut: list[int]) -> bool:
        """Exploring: whether the requests none of whose drafts has been verified yet draft in explore_share of
        the step's rows, and their drafts, uncut, would pay for the step on their own (fresh requests copying
        at once; not a few free-text requests' chance matches)."""
        fresh = [(self._state[r.rid], n) for r, n in zip(reqs, uncut) if n and self._state[r.rid].first_tries == 0]
        return (len(fresh) >= T.explore_share * len(reqs)
                and sum(s.first_chance() * n for s, n in fresh) >= min_expected(len(reqs)))

    @staticmethod
    def _keeps(state: AdaptiveState, explore: bool) -> bool:
        """Whether a request keeps its draft in a large step whose drafts do not pay (_step_pays): one on a
        streak (copying: its last drafts were accepted whole), and, where the step explores, one none of whose
        drafts has been verified yet."""
        return state.streak >= T.large_batch_streak or (explore and state.first_tries == 0)

    def _may_pay(self, lookups: list[Lookup], rows: int) -> bool:
        """Whether any draft could survive _step_pays: a request on a streak keeps its draft, and the others'
        drafts (those _explores counts too) can expect at most first_chance * k accepted tokens each."""
        states = [self._state[lookup.req.rid] for lookup in lookups]
        return (any(s.streak >= T.large_batch_streak for s in states)
                or sum(s.first_chance() * lookup.priced_k for s, lookup in zip(states, lookups))
                >= min_expected(rows))

    def _step_pays(self, reqs: list[Req], drafts: list[list[int]]) -> bool:
        """Whether the drafts' expected accepted tokens reach what a large step asks of them
        (cost.min_expected): a few unlikely drafts among many decode rows do not."""
        expected = sum(self._state[r.rid].first_chance() * len(d) for r, d in zip(reqs, drafts) if d)
        return expected == 0 or expected >= min_expected(len(reqs))

    def _cap(self, reqs: list[Req], drafts: list[list[int]], cap: int) -> list[list[int]]:
        """At most `cap` draft tokens in the step: a batch of verify rows is compute-bound (each draft token
        costs a token's forward), so the tokens go to the requests whose drafts are accepted most."""
        order = sorted(range(len(reqs)), key=lambda i: -self._state[reqs[i].rid].acceptance)  # _budget made them
        out = [list(d) for d in drafts]
        left = cap
        for i in order:
            out[i] = out[i][: max(0, left)]
            left -= len(out[i])
        return out

    def draft_q(self, req: Req) -> torch.Tensor | None:
        """The distributions [k, V] req's draft of this step was sampled from (None: deterministic)."""
        return self._q.pop(req.rid, None)

    def _budget(self, req: Req, state: AdaptiveState) -> tuple[int, bool]:
        """(draft length, whether speculation is active: not paused by the adaptive state)."""
        active = state.wants_proposal()
        # One token after the draft is always sampled: keep draft + 1 within max_new_tokens and the context.
        room = min(req.max_new_tokens - len(req.output_ids), self.context_len - req.seq_len()) - 1
        return max(0, min(state.k if active else self.max_k, room)), active

    def on_verified(self, req: Req, proposed: int, accepted: int, emitted: int) -> None:
        req.num_spec_proposed += proposed
        req.num_spec_accepted += accepted
        s = self.stats
        s.num_verify_rows += 1
        s.num_proposed += proposed
        s.num_accepted += accepted
        s.num_emitted += emitted
        s.per_k[proposed] = s.per_k.get(proposed, 0) + 1
        self.proposer.on_verified(req, proposed, accepted)
        state = self._state.get(req.rid)
        if state is not None:
            state.update(proposed, accepted, self.max_k, self.config.speculative_min_acceptance)

    def on_finish(self, req: Req, later: bool = False) -> None:
        """later: the proposer lets go of req at settle() (a request finished in a step: its text leaving
        the live table and entering the corpus costs the host a few us a token, which the next launches hide:
        tuning.settle_tokens)."""
        self._state.pop(req.rid, None)
        self._q.pop(req.rid, None)
        self._settle_clashes([req])  # the proposer keys its state by rid: one request per rid at a time
        if later:
            self._finished[req.rid] = req
        else:
            self.proposer.on_finish(req)

    def settle(self, budget: bool = False) -> None:
        """The proposer's part of on_finish for the requests finished in steps, oldest first: after the next
        launches (observe; budget: tuning.settle_tokens a step), or all once the scheduler is idle (SchedulerLoop),
        after their outputs have gone."""
        left = None
        if budget and self._finished:
            backlog = sum(req.seq_len() for req in self._finished.values())
            left = max(T.settle_tokens, backlog // T.settle_spread)
        while self._finished and (left is None or left > 0):
            req = self._finished.pop(next(iter(self._finished)))
            self.proposer.on_finish(req)
            if left is not None:
                left -= req.seq_len()

    def _settle_clashes(self, reqs: list[Req]) -> None:
        """Settle now any finished request whose rid one of reqs (running, or finishing) reuses."""
        if self._finished:
            for req in reqs:
                old = self._finished.get(req.rid)
                if old is not None and old is not req:
                    del self._finished[req.rid]
                    self.proposer.on_finish(old)

    def flush(self) -> None:
        self.settle()
        self.proposer.flush()

    def check_integrity(self, idle: bool) -> None:
        assert not idle or not self._state, "adaptive states left while idle"
        assert not idle or not self._q, "draft distributions left while idle"
        assert not idle or not self._finished, "finished requests left unsettled while idle"
        self.proposer.check_integrity(idle)


def _grammar_prefix(matcher, draft: list[int]) -> list[int]:
    """The longest prefix of draft the grammar allows from its current state (matcher left unchanged)."""
    n = 0
    for tok in draft:
        if not matcher.accept_token(tok):
            break
        n += 1
        if matcher.is_terminated():
            break
    if n:
        matcher.rollback(n)
    return draft[:n]
