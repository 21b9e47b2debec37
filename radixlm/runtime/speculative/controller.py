"""SpecController: what the scheduler asks of speculative decoding (the hooks stay a few lines there).

Runs in the scheduler process. Per step: `propose` gives each decoding request its draft tokens (bounded
by max_new_tokens, the context, the grammar, the request's stops (stop_cut.py) and its adaptive draft
length; none where the step's size makes the draft unlikely to pay, cost.py); the scheduler turns
a request with a draft into one extend row [last token, d1..dk] and the OutputProcessor verifies it
(verify.py); `on_verified` feeds the adaptive state and the counters; `on_finish` drops the request's
state, and the proposer's (a finished sequence goes to the cross-request n-gram corpus) at once for an
abort, at `settle` for a request finished in a step (after the next launches, or once idle). Every running
request (also one still prefilling) is shown to the proposer (`observe`, which the scheduler calls right
after launching each step), so an n-gram proposal can continue the text of another request running now
(ngram.LiveNgrams). The NGRAM proposer is ngram_proposer.py.
"""

from __future__ import annotations

from typing import Protocol

import torch

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.speculative.adaptive import AdaptiveState
from radixlm.runtime.speculative.cost import min_chance, min_expected
from radixlm.runtime.speculative.stats import SpecStats
from radixlm.runtime.speculative.stop_cut import StopCut


# A suffix match at least this long is proposed even while a request's speculation is paused (adaptive.py):
# a long exact repeat (copied text) is strong evidence, and an n-gram lookup costs no forward.
STRONG_MATCH = 6
# While a request's drafts are being accepted (one has been, and its acceptance average is at least
# COPYING_ACCEPTANCE: it is copying text, e.g. values from a record into JSON), a suffix match as short as
# ngram_proposer.COPYING_MIN_MATCH in its own tokens is proposed: right after a copied value starts
# ('"name": "Alice' -> ' Johnson') only its last token matches the source. Otherwise (free text) short
# matches are mostly wrong: speculative_ngram_min_match. 0.35, not 0.5: a JSON answer's drafts are
# accepted in part (a value ends where the source's does not), which kept its average around 0.4-0.6 and
# its short matches off half the time (measured: 2.6 -> 3.4 tokens per forward at batch 1 with the text
# lookup, docs/benchmarks.md).
# In a step with LARGE_BATCH+ rows a request whose last draft had no token accepted is not copying for its
# next draft (however high its average): a copy that has just ended (a code block closed, the prose after it
# begins) would otherwise go on proposing 1-token matches and text lookups for several steps while the
# average decays, each a draft of verify tokens nobody accepts (code at batch 16; docs/benchmarks.md,
# session 31).
COPYING_ACCEPTANCE = 0.35
# In a step with this many decoding rows the forward is compute-bound (each draft token costs about a
# token's share of it), and a closed batch runs as long as its slowest request, so a request that is not
# copying needs a match ngram_proposer.LARGE_BATCH_EXTRA_MATCH tokens longer than
# speculative_ngram_min_match (measured: free text at batch 16 0.95x -> 0.97-0.98x of plain decode with 1;
# 2 since the packed weight layout made a batch-16 decode step cheaper next to its verify tokens;
# docs/benchmarks.md, runs 4 and 5).
# Not in its own text once it has had drafts accepted, though: there speculative_ngram_min_match holds (a
# JSON row that invented part of a value, 'jemel' for 'emeka', copies its record again from '.4@example.com';
# json at 16 rows: 19 -> 18 steps, 1038 -> 1032 forward tokens; code 78 -> 77 steps, 2302 -> 2255; chat and
# free unchanged; docs/benchmarks.md, session 34).
LARGE_BATCH = 8
# ... and proposes at most LARGE_BATCH_MAX_DRAFT tokens unless its last LARGE_BATCH_STREAK drafts were
# accepted whole (speculative_num_draft_tokens bounds the rest): at batch 16 verify tokens are compute-bound,
# and the drafts that run past 4 tokens are mostly cut (a JSON value's end, free text), while a request
# copying long runs gains from 8 (replayed, session 26: k = 8 for all at batch 16 took json 1.35x -> 1.28x
# and free text 0.95x -> 0.92x, chat 1.49x -> 1.85x; with the streak rule json 1.34x, free 0.97x, code
# 1.45x -> 1.55x, chat 1.49x -> 1.65x; docs/benchmarks.md).
LARGE_BATCH_MAX_DRAFT = 4
LARGE_BATCH_STREAK = 2
# PADDED: where a step's verify forward pads every row to 1 + speculative_num_draft_tokens tokens (CUDA's verify
# graphs, model/verify_graph.py: up to `padded_rows` rows), the padding is computed whatever the drafts' lengths,
# so the cuts that price a draft token by its compute (the cap above, and the proposer's: the fourth field of a
# proposal, ngram_proposer's OWN_WEAK_MAX_DRAFT and agreement cut) would only lose accepted tokens there: such a
# step verifies whole drafts. Whether it verifies at all is still decided on the cut drafts, as where the cuts
# apply: a verify step costs the host more, and the device a little more than a decode step (docs/benchmarks.md,
# session 40: replayed at 16 rows, code 77 -> 75 steps, json 15 -> 13, chat 10 -> 7, free text unchanged (no
# draft); deciding on the whole drafts took code to 72 but had free text verify 163 draft tokens in 9 steps and
# saved none: more host time for nothing).
# Where a lone decoding row steps through the model in one call (the CPU's cpu_ops.decode_stack: the GEMV and
# the bf16-read argmax head), a verify row of 1 + k tokens takes the module path: ~1.3-1.5x that step
# with 1-3 draft tokens (the tiled GEMV's few rows), 1.5-2x with more (oneDNN's GEMMs; docs/benchmarks.md,
# sessions 31 and 35), so a draft alone must be likely (first_chance) or a strong match (STRONG_MATCH, as
# while paused). cost.min_chance(1) predates the one-call step and asks 0.1.
ONE_ROW_CHANCE = 0.35
COST_AWARE = True  # drop drafts whose first token's chance does not pay for them (cost.py)
# Exploring: a large step whose drafts do not pay (_step_pays) still verifies the drafts of the requests none of
# whose drafts has been verified yet, where those drafts, before the proposer's cuts, would pay on their own
# (_explores). Such a request's chance is the prior's and an own-text draft is cut to
# ngram_proposer.OWN_WEAK_MAX_DRAFT tokens until one is accepted whole; at 8-11 rows that never paid
# (8 x 0.5 x 2 tokens against min_expected(8) = 10.7), so neither estimate could change: code and chat at
# 8-11 rows never speculated (code at 8 rows 128 -> 75 steps, chat 46 -> 10; 12+ rows unchanged).
# Exploring every fresh request's first draft instead had free text verify a few lone chance matches a run
# (free at 8 rows 0.99x -> 0.97x on the CPU: each such step leaves the faster decode path), and without
# EXPLORE_SHARE 8 of 24 free-text requests that share a topic were explored: 73% of their drafts were then
# accepted, but a closed batch runs as long as its slowest request (free at 24 rows 0.99x -> 0.97x;
# docs/benchmarks.md, session 40).
EXPLORE_SHARE = 0.5
# A request finished in a step leaves the proposer (its text out of the live table and into the corpus, a few
# us a token of prompt + output on the CPU) after the next launch, where a GPU's step hides it; but a step
# settles at most SETTLE_TOKENS of such text, or 1/SETTLE_SPREAD of the backlog where that is more: code at
# 16 rows finishes 12 requests in one step, 14.6 ms of settling against a device step of ~2.5 ms on the H200
# (docs/benchmarks.md, session 39). The rest wait for the next launches, or for the idle loop.
SETTLE_TOKENS = 256
SETTLE_SPREAD = 16


class Proposer(Protocol):
    cheap: bool  # True: proposing costs no forward (asked even while paused, for strong matches only)

    def propose(self, reqs: list[Req], ks: list[int], copying: list[bool], large_batch: bool = False
                ) -> list[tuple[list[int], int, torch.Tensor | None, int]]:
        """Per request (draft tokens, suffix match length (0 where not an n-gram), the distributions [k, V]
        the tokens were sampled from, or None for deterministic proposals, how many of the tokens to keep
        where each costs the step's forward its compute); copying: whether the request's drafts are being
        accepted (an n-gram proposer then accepts a shorter match); large_batch: the step has LARGE_BATCH+
        decoding rows (an n-gram proposer then wants a longer match from the others, and keeps fewer of a
        weak draft's tokens)."""

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
        self.one_call_decode = one_call_decode  # a lone decode row runs the model in one call (ONE_ROW_CHANCE)
        self.padded_rows = padded_rows  # steps of up to this many rows verify on padded rows (PADDED)
        self.max_k = config.max_draft
        self.cost_aware = COST_AWARE
        self.stats = SpecStats()
        self.observes_after_launch = False  # set by the first observe(): the scheduler indexes after launches
        self._finished: dict[str, Req] = {}  # finished in steps, not yet let go of by the proposer (settle)
        self._state: dict[str, AdaptiveState] = {}
        self._q: dict[str, torch.Tensor] = {}  # this step's sampled drafts' distributions (verify.py)

    def propose(self, reqs: list[Req], running: list[Req] | None = None) -> list[list[int]]:
        """Draft tokens per decoding request ([] = a plain decode row); running: every running request
        (decoding or still prefilling), whose text proposals may continue."""
        large = len(reqs) >= LARGE_BATCH
        # PADDED: the drafts' lengths cost this step's forward nothing (an n-gram's cost no forward either)
        padded = large and len(reqs) <= self.padded_rows and self.proposer.cheap
        chosen, ks, priced_ks, copying, strong_only = self._choose(reqs, large, padded)
        if large and self.cost_aware and not self._may_pay(chosen, priced_ks, len(reqs)):
            chosen = []  # _step_pays would drop every draft: no lookups (on a GPU the host's time is the step's)
        if not self.observes_after_launch:  # (once it does, observe shows the proposer every request first)
            shown = running if running is not None else reqs
            self._settle_clashes(shown)
            self.proposer.observe(shown)
        self._q.clear()
        if not chosen:  # nothing looked up (free text in a large step, mostly): no draft to cut or count
            return [[] for _ in reqs]
        proposals = self.proposer.propose(chosen, ks, copying, large)
        drafts = dict(zip((r.rid for r in chosen), proposals))
        caps = dict(zip((r.rid for r in chosen), priced_ks))
        out, priced, uncut = self._cut(reqs, drafts, caps, strong_only, padded)
        if large and self.cost_aware and not self._step_pays(reqs, priced):
            explore = self._explores(reqs, uncut)
            out = [d if self._keeps(self._state[r.rid], explore) else [] for r, d in zip(reqs, out)]
        if self.config.speculative_max_batch_draft_tokens is not None:
            out = self._cap(reqs, out, self.config.speculative_max_batch_draft_tokens)
        if large:  # a lookup whose draft is dropped (paused, not paying) was as dry as one that found nothing
            for req, draft in zip(reqs, out):
                if req.rid in drafts:
                    self._state[req.rid].looked_up(bool(draft))
        for req, draft in zip(reqs, out):
            q = drafts.get(req.rid, (None, None, None, 0))[2]
            if draft and q is not None:
                self._q[req.rid] = q[: len(draft)]
        return out

    def _choose(self, reqs: list[Req], large: bool, padded: bool
                ) -> tuple[list[Req], list[int], list[int], list[bool], set[str]]:
        """The requests to look up: (them, their draft lengths, the lengths a step that prices draft tokens
        allows (LARGE_BATCH_MAX_DRAFT), whether each is copying, the rids that keep only strong matches)."""
        chosen, ks, priced_ks, copying, strong_only = [], [], [], [], set()
        need = min_chance(len(reqs)) if self.cost_aware else 0.0
        for req in reqs:
            state = self._state.get(req.rid)
            if state is None:
                state = self._state[req.rid] = AdaptiveState(self.max_k)
            if large and state.dry():
                state.wants_proposal()  # a pause counts down in the steps its lookups skip as well
                continue  # its lookups have found nothing for a while (adaptive.DRY_LOOKUPS)
            k, active = self._budget(req, state)
            priced_k = min(k, LARGE_BATCH_MAX_DRAFT) if large and state.streak < LARGE_BATCH_STREAK else k
            if state.first_chance() < need:
                continue  # unlikely to be accepted at all: its verify tokens would cost more than they save
            unlikely = (len(reqs) == 1 and self.one_call_decode and self.cost_aware
                        and state.first_chance() < ONE_ROW_CHANCE)
            if unlikely and not self.proposer.cheap:
                continue  # a draft model's proposal costs forwards, and only a strong n-gram match would stay
            if k > 0 and (active or self.proposer.cheap):
                chosen.append(req)
                ks.append(k if padded else priced_k)
                priced_ks.append(priced_k)
                copying.append(active and req.num_spec_accepted > 0 and state.acceptance >= COPYING_ACCEPTANCE
                               and not (large and state.missed))
                if not active or unlikely:  # paused, or alone and unlikely: only a strong match is kept
                    strong_only.add(req.rid)
        return chosen, ks, priced_ks, copying, strong_only

    def observe(self, running: list[Req]) -> None:
        """Index the running requests' text while the device runs the step just launched (the scheduler
        calls this after each launch): on a GPU the host's work is hidden there. From the first call on,
        propose leaves indexing to it, so at a proposal the newest token of a request that looks nothing
        up is not yet indexed (an n-gram continuing with it matters only where a token repeats itself)."""
        self.observes_after_launch = True
        self._settle_clashes(running)
        self.settle(budget=True)
        self.proposer.observe(running)

    def _cut(self, reqs: list[Req], drafts: dict, caps: dict[str, int], strong_only: set[str], padded: bool
             ) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """Each request's draft as the step verifies it (the proposer's and the controller's cuts for a draft
        token's compute but where the step is PADDED, the grammar's and the stops'), what those cuts keep of
        it, and its length before the proposer's cuts (up to the step's cap: _explores's estimate)."""
        out, priced, uncut = [], [], []
        for req in reqs:
            draft, match, _, keep = drafts.get(req.rid, ([], 0, None, 0))
            if req.rid in strong_only and match < STRONG_MATCH:
                draft = []
            uncut.append(min(len(draft), caps.get(req.rid, 0)))
            if not padded:
                draft = draft[:keep]
            if draft and req.grammar is not None:
                draft = _grammar_prefix(req.grammar, draft)
            if draft and self.stop_cut is not None:
                draft = self.stop_cut.cut(req, draft)
            out.append(draft)
            priced.append(draft[: min(keep, caps.get(req.rid, 0))])
        return out, priced, uncut

    def _explores(self, reqs: list[Req], uncut: list[int]) -> bool:
        """Exploring: whether the requests none of whose drafts has been verified yet draft in EXPLORE_SHARE of
        the step's rows, and their drafts, uncut, would pay for the step on their own (fresh requests copying
        at once; not a few free-text requests' chance matches)."""
        fresh = [(self._state[r.rid], n) for r, n in zip(reqs, uncut) if n and self._state[r.rid].first_tries == 0]
        return (len(fresh) >= EXPLORE_SHARE * len(reqs)
                and sum(s.first_chance() * n for s, n in fresh) >= min_expected(len(reqs)))

    @staticmethod
    def _keeps(state: AdaptiveState, explore: bool) -> bool:
        """Whether a request keeps its draft in a large step whose drafts do not pay (_step_pays): one on a
        streak (copying: its last drafts were accepted whole), and, where the step explores, one none of whose
        drafts has been verified yet."""
        return state.streak >= LARGE_BATCH_STREAK or (explore and state.first_tries == 0)

    def _may_pay(self, chosen: list[Req], ks: list[int], rows: int) -> bool:
        """Whether any draft could survive _step_pays: a request on a streak keeps its draft, and the others'
        drafts (those _explores counts too) can expect at most first_chance * k accepted tokens each."""
        states = [self._state[r.rid] for r in chosen]
        return (any(s.streak >= LARGE_BATCH_STREAK for s in states)
                or sum(s.first_chance() * k for s, k in zip(states, ks)) >= min_expected(rows))

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
        SETTLE_TOKENS)."""
        self._state.pop(req.rid, None)
        self._q.pop(req.rid, None)
        self._settle_clashes([req])  # the proposer keys its state by rid: one request per rid at a time
        if later:
            self._finished[req.rid] = req
        else:
            self.proposer.on_finish(req)

    def settle(self, budget: bool = False) -> None:
        """The proposer's part of on_finish for the requests finished in steps, oldest first: after the next
        launches (observe; budget: SETTLE_TOKENS a step), or all once the scheduler is idle (SchedulerLoop),
        after their outputs have gone."""
        left = None
        if budget and self._finished:
            backlog = sum(req.seq_len() for req in self._finished.values())
            left = max(SETTLE_TOKENS, backlog // SETTLE_SPREAD)
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
