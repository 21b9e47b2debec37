"""The cost-aware draft budget: a draft is proposed only where its first token's chance of acceptance pays for
its place in the step, larger batches take shorter drafts, and the default draft length per algorithm."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.speculative.adaptive import AdaptiveState
from radixlm.runtime.speculative.controller import SpecController
from radixlm.runtime.speculative.cost import min_chance, min_expected
from radixlm.runtime.speculative.drafts import NO_DRAFT, Draft
from radixlm.runtime.speculative.ngram_proposer import NgramProposer
from radixlm.runtime.speculative.tuning import TUNING as T

from tests.runtime.test_speculative_verify import _req

# [1..5] continues 9, 8, 7, ...: a 5-gram, long enough for a request that is not copying in a large batch
REPEAT = [1, 2, 3, 4, 5, 9, 8, 7, 6, 15, 14, 13, 12, 11, 1, 2, 3, 4, 5]


def test_a_draft_must_be_likelier_to_pay_in_a_larger_batch():
    chances = [min_chance(rows) for rows in (1, 2, 4, 8, 16, 64)]
    assert chances == sorted(chances)
    assert chances[0] < 0.15 < 0.3 < chances[4] < T.first_prior  # batch 1: long shots pay; a fresh request still drafts


def test_first_chance_follows_the_requests_first_tokens():
    state = AdaptiveState(k=4)
    assert state.first_chance() == T.first_prior
    for _ in range(3):
        state.update(4, 0, 4, 0.0)  # first token rejected
    low = state.first_chance()
    assert low < min_chance(16)
    state.update(4, 1, 4, 0.0)  # accepted (one token is enough: it is the first token's chance)
    assert state.first_chance() > low


def _seen(ctl, reqs, chance=T.first_prior):
    """Give reqs a verified draft each (no longer explored: SpecController._explores), first-token chance `chance`."""
    for req in reqs:
        ctl._state[req.rid] = AdaptiveState(ctl.max_k, first_hits=2 * chance - T.first_prior, first_tries=1.0)


def _controller(k=None, one_call_decode=True):
    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=k)
    proposer = NgramProposer(config)
    proposer.own_prior = 1.0  # these drafts are own-text repeats: their cap at a large batch is tested apart
    return SpecController(config, proposer, context_len=1024, one_call_decode=one_call_decode)


def test_rejected_first_tokens_stop_drafts_at_a_large_batch_and_weak_ones_alone():
    ctl = _controller(k=4)
    reqs = [_req(f"r{i}", REPEAT) for i in range(16)]
    assert ctl.propose(reqs[:1]) == [[9, 8, 7, 6]]
    assert all(d == [9, 8, 7, 6] for d in ctl.propose(reqs))  # no history: the prior pays at batch 16
    for _ in range(3):
        ctl.adaptive("r0").first_hits *= 0.5
        ctl.adaptive("r0").first_tries += 1.0
    assert ctl.adaptive("r0").first_chance() < min_chance(16)
    drafts = ctl.propose(reqs)
    assert drafts[0] == [] and all(d == [9, 8, 7, 6] for d in drafts[1:])
    assert ctl.propose(reqs[1:3]) == [[9, 8, 7, 6]] * 2  # two rows: the prior still pays
    # Alone, a verify step leaves the one-call decode path: an unlikely draft needs a strong match.
    assert ctl.adaptive("r0").first_chance() < T.one_row_chance
    assert ctl.propose(reqs[:1]) == [[]]
    strong = _req("s", [1, 2, 3, 4, 5, 6, 9, 8, 7, 6, 15, 1, 2, 3, 4, 5, 6])  # a 6-token repeat
    ctl._state["s"] = ctl.adaptive("r0")
    assert ctl.propose([strong]) == [[9, 8, 7, 6]]
    ctl.one_call_decode = False  # a lone row's verify costs about its decode step (a GPU): the prior pays
    assert ctl.propose(reqs[:1]) == [[9, 8, 7, 6]]
    ctl.cost_aware = False
    assert ctl.propose(reqs)[0] == [9, 8, 7, 6]


def test_large_batches_take_shorter_drafts_unless_whole_drafts_were_accepted():
    ctl = _controller()
    assert ctl.max_k == 8
    full = [9, 8, 7, 6, 15, 14, 13, 12]
    reqs = [_req(f"r{i}", REPEAT) for i in range(T.large_batch)]
    assert ctl.propose(reqs[:1]) == [full]
    assert ctl.propose(reqs) == [full[:T.large_batch_max_draft]] * T.large_batch
    for _ in range(T.large_batch_streak):
        ctl.adaptive("r0").update(4, 4, 8, 0.25)  # accepted whole
    assert ctl.propose(reqs) == [full] + [full[:T.large_batch_max_draft]] * (T.large_batch - 1)
    ctl.adaptive("r0").update(4, 3, 8, 0.25)  # cut: back to the short drafts
    assert ctl.propose(reqs)[0] == full[:T.large_batch_max_draft]
    # A verify step padded to 1 + k tokens a row (CUDA's verify graphs) computes the padding anyway: no cap
    ctl.padded_rows = T.large_batch
    assert ctl.propose(reqs) == [full] * T.large_batch
    assert ctl.propose(reqs + [_req("x", REPEAT)])[0] == full[:T.large_batch_max_draft]  # past the graphs' rows


def test_a_padded_step_decides_on_the_cut_drafts_and_verifies_whole_ones():
    ctl = _controller()
    ctl.padded_rows = 17  # a step of up to 17 rows replays a padded graph
    full = [9, 8, 7, 6, 15, 14, 13, 12]
    other = [_req(f"p{i}", [20 + i, 30 + i]) for i in range(10)]  # nothing to propose
    drafting = [_req(f"r{i}", REPEAT) for i in range(7)]
    _seen(ctl, drafting)
    # 7 requests (chance 0.5) x 4 cut tokens reach what 17 rows ask: whole drafts are verified
    assert 7 * 0.5 * T.large_batch_max_draft >= min_expected(17)
    assert ctl.propose(other + drafting)[10:] == [full] * 7
    # 6 do not, though their whole drafts would: no draft, as where the cuts apply
    assert 6 * 0.5 * T.large_batch_max_draft < min_expected(16) <= 6 * 0.5 * len(full)
    assert ctl.propose(other + drafting[:6]) == [[]] * 16
    ctl.padded_rows = 0
    assert ctl.propose(other + drafting)[10:] == [full[:T.large_batch_max_draft]] * 7


def test_a_padded_step_still_caps_a_draft_model_whose_tokens_cost_forwards():
    class Recording:
        cheap = False  # a draft model: each draft token is a forward of its own

        def __init__(self):
            self.ks = []

        def observe(self, reqs):
            pass

        def propose(self, reqs, ks, copying, large_batch=False):
            self.ks.append(list(ks))
            return [Draft([1] * k, 0, None, k) for k in ks]

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)
    proposer = Recording()
    ctl = SpecController(config, proposer, context_len=1024, padded_rows=64)
    ctl.propose([_req(f"r{i}", REPEAT) for i in range(T.large_batch)])
    assert proposer.ks == [[T.large_batch_max_draft] * T.large_batch]
    proposer.cheap = True  # an n-gram's lookup costs no forward: the padded step asks for whole drafts
    ctl.propose([_req(f"r{i}", REPEAT) for i in range(T.large_batch)])
    assert proposer.ks[-1] == [8] * T.large_batch


def test_default_draft_length_per_algorithm():
    assert SpeculativeConfig(speculative_algorithm="NGRAM").max_draft == 8
    assert SpeculativeConfig(speculative_algorithm="STANDALONE", speculative_draft_model_path="/d").max_draft == 4
    assert SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=3).max_draft == 3


def test_a_lone_unlikely_draft_does_not_pay_for_a_large_step():
    ctl = _controller()
    other = [_req(f"p{i}", [20 + i, 30 + i]) for i in range(15)]  # nothing to propose
    lone = _req("r", REPEAT)
    full = [9, 8, 7, 6, 15, 14, 13, 12]
    assert 0.5 * T.large_batch_max_draft < min_expected(16)
    assert ctl.propose(other + [lone])[-1] == []  # a fresh request (chance 0.5) alone: 2 expected tokens
    assert ctl.adaptive("r").first_tries == 0  # and it is not explored (a lone chance match, as in free text)
    for _ in range(3):
        ctl.adaptive("r").update(4, 4, 8, 0.25)  # accepted whole: a streak, and a chance past 0.8
    assert ctl.propose(other + [lone])[-1] == full  # a request on a streak keeps its draft
    assert ctl.propose([_req("s", REPEAT)]) == [full]  # a small step: no rule


def test_a_large_step_verifies_the_drafts_of_requests_never_verified_once():
    """Own-text copies at 8 rows: each draft is cut to T.own_weak_max_draft tokens until one is accepted whole,
    and 8 of those at the prior chance do not pay for the step. Without a first verification neither could
    change (code and chat at 8-11 rows never speculated); a request none of whose drafts has been verified
    keeps its draft once."""
    config = SpeculativeConfig(speculative_algorithm="NGRAM")
    ctl = SpecController(config, NgramProposer(config), context_len=1024, one_call_decode=True)
    reqs = [_req(f"r{i}", REPEAT) for i in range(T.large_batch)]
    assert T.large_batch * T.first_prior * T.own_weak_max_draft < min_expected(T.large_batch)
    drafts = ctl.propose(reqs)
    assert drafts == [[9, 8]] * T.large_batch  # the weak cut, verified: nothing is known of them yet
    for req in reqs:
        ctl.on_verified(req, 2, 2, 3)  # accepted whole
    assert ctl.propose(reqs) == [[9, 8, 7, 6]] * T.large_batch  # above the own-text bar: 4 tokens, and they pay
    for req in reqs:
        ctl.on_verified(req, 4, 0, 1)  # rejected: the chance falls (0.75 -> 0.42) ...
    assert all(d == [] for d in ctl.propose(reqs))  # ... and, already verified, they are not explored again
    for req in reqs:
        ctl.on_finish(req)
    ctl.check_integrity(idle=True)


def test_exploring_asks_half_the_rows_to_be_fresh_drafts():
    """A few fresh requests' chance matches among many rows (free text on a shared topic) are not explored,
    though their uncut drafts would pay: a closed batch runs as long as its slowest request."""
    config = SpeculativeConfig(speculative_algorithm="NGRAM")
    ctl = SpecController(config, NgramProposer(config), context_len=1024, one_call_decode=True)
    other = [_req(f"p{i}", [20 + i, 30 + i]) for i in range(9)]  # nothing to propose
    drafting = [_req(f"r{i}", REPEAT) for i in range(7)]
    assert T.explore_share * 16 > 7 and 7 * T.first_prior * T.large_batch_max_draft >= min_expected(16)
    assert all(d == [] for d in ctl.propose(other + drafting))
    drafting.append(_req("r7", REPEAT))  # 8 of 16
    assert ctl.propose(other[1:] + drafting)[8:] == [[9, 8]] * 8


def test_a_large_step_that_does_not_pay_keeps_only_the_streaks_drafts():
    ctl = _controller()
    fresh = [_req(f"f{i}", REPEAT) for i in range(2)]  # chance 0.5 x 4 tokens each: too little for 16 rows
    other = [_req(f"p{i}", [20 + i, 30 + i]) for i in range(13)]
    copier = _req("c", REPEAT)
    reqs = fresh + other + [copier]
    _seen(ctl, reqs)
    assert 2 * 0.5 * T.large_batch_max_draft + 8 * 0.8 < min_expected(16)
    assert all(d == [] for d in ctl.propose(reqs))
    for _ in range(T.large_batch_streak + 1):
        ctl.adaptive("c").update(4, 4, 8, 0.25)
    drafts = ctl.propose(reqs)
    assert drafts[-1] == [9, 8, 7, 6, 15, 14, 13, 12] and all(d == [] for d in drafts[:-1])


def test_a_lone_unlikely_request_asks_no_draft_model():
    """A proposer that costs forwards (a draft model) is not asked for a lone row's unlikely draft: only a
    strong n-gram match could be kept there, and a draft model's proposals have no match length."""

    class Counting:
        cheap = False

        def __init__(self):
            self.asked = 0

        def observe(self, reqs):
            pass

        def propose(self, reqs, ks, copying, large_batch=False):
            self.asked += 1
            return [Draft([9, 8], 0, None, 2) for _ in reqs]

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    proposer = Counting()
    ctl = SpecController(config, proposer, context_len=1024, one_call_decode=True)
    req = _req("d", REPEAT)
    assert ctl.propose([req]) == [[9, 8]] and proposer.asked == 1  # the prior: likely enough
    for _ in range(2):
        ctl.adaptive("d").update(2, 0, 2, 0.0)  # first tokens rejected
    assert ctl.propose([req]) == [[]] and proposer.asked == 1
    assert ctl.propose([req, _req("e", REPEAT)])[1] == [9, 8] and proposer.asked == 2  # two rows: asked


class _Counting:
    """A cheap proposer that records what it is asked: a fixed draft for the requests named in `finds`."""
    cheap = True

    def __init__(self, finds=()):
        self.finds, self.asked, self.observed, self.finished = set(finds), [], 0, []

    def observe(self, reqs):
        self.observed += 1

    def propose(self, reqs, ks, copying, large_batch=False):
        self.asked.append([r.rid for r in reqs])
        return [Draft([9, 8], 8, None, 2) if r.rid in self.finds else NO_DRAFT for r in reqs]

    def on_verified(self, req, proposed, accepted):
        pass

    def on_finish(self, req):
        self.finished.append(req.rid)

    def check_integrity(self, idle):
        pass


def _counting_controller(finds=()):
    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    proposer = _Counting(finds)
    return SpecController(config, proposer, context_len=1024, one_call_decode=False), proposer


def test_a_large_step_whose_drafts_could_not_pay_looks_nothing_up():
    ctl, proposer = _counting_controller()
    reqs = [_req(f"r{i}", REPEAT) for i in range(16)]
    for r in reqs:  # each chance pays for a draft, but together they cannot pay for the step
        ctl._state[r.rid] = AdaptiveState(2, first_hits=0.25, first_tries=1.0)
    assert ctl.adaptive("r0").first_chance() >= min_chance(16)
    assert sum(s.first_chance() * 2 for s in ctl._state.values()) < min_expected(16)
    assert ctl.propose(reqs) == [[]] * 16 and proposer.asked == []
    ctl.adaptive("r3").streak = T.large_batch_streak  # a request on a streak keeps its draft: the step looks up
    ctl.propose(reqs)
    assert len(proposer.asked) == 1


def test_dry_lookups_back_off_in_large_steps_and_resume():
    ctl, proposer = _counting_controller(finds={"hit"})
    reqs = [_req("hit", REPEAT)] + [_req(f"dry{i}", REPEAT) for i in range(T.large_batch - 1)]
    ctl._state["hit"] = AdaptiveState(2, streak=T.large_batch_streak)  # its drafts are kept in large steps
    for _ in range(T.dry_lookups):
        drafts = ctl.propose(reqs)
        assert drafts[0] == [9, 8] and drafts[1:] == [[]] * (T.large_batch - 1)
    for _ in range(T.dry_skip):  # the dry requests are skipped; the one whose lookups give drafts is not
        assert ctl.propose(reqs)[0] == [9, 8] and proposer.asked[-1] == ["hit"]
    ctl.propose(reqs)
    assert len(proposer.asked[-1]) == T.large_batch  # the skip is over: looked up again
    small = reqs[:2]  # below T.large_batch nothing is skipped
    ctl.propose(small)
    assert proposer.asked[-1] == ["hit", "dry0"]


def test_a_pause_counts_down_while_the_lookups_are_skipped():
    ctl, _ = _counting_controller()
    reqs = [_req(f"r{i}", REPEAT) for i in range(T.large_batch)]
    ctl.propose(reqs)
    state = ctl.adaptive("r0")
    state.cooldown, state.skip = 3, 5  # paused, and dry: its lookups skipped for 5 steps
    for _ in range(3):
        ctl.propose(reqs)
    assert state.cooldown == 0 and state.skip == 2  # both counted every step


def test_the_skip_doubles_while_lookups_stay_dry():
    state = AdaptiveState(4)
    skips = []
    for _ in range(3):
        for _ in range(T.dry_lookups):
            assert not state.dry()
            state.looked_up(False)
        n = 0
        while state.dry():
            n += 1
        skips.append(n)
    assert skips == [T.dry_skip, 2 * T.dry_skip, 4 * T.dry_skip]
    state.looked_up(True)
    assert state.next_skip == T.dry_skip and state.dry_lookups == 0


def test_indexing_moves_after_the_launch_once_the_scheduler_observes():
    ctl, proposer = _counting_controller()
    reqs = [_req("a", REPEAT)]
    ctl.propose(reqs)
    assert proposer.observed == 1  # alone (tests, tools): propose indexes first
    ctl.observe(reqs)  # the scheduler, after launching a step
    ctl.propose(reqs)
    assert proposer.observed == 2 and ctl.observes_after_launch


def test_requests_finished_in_a_step_are_let_go_of_after_the_next_launch():
    """The proposer's part of a finish (text out of the live table, into the corpus) waits for the next
    launch or the idle loop; an abort's happens at once."""
    ctl, proposer = _counting_controller()
    ctl.on_finish(_req("aborted", REPEAT))
    ctl.on_finish(_req("done", REPEAT), later=True)
    assert proposer.finished == ["aborted"]
    with pytest.raises(AssertionError, match="unsettled"):
        ctl.check_integrity(idle=True)
    ctl.observe([])  # the scheduler, after launching the next step
    assert proposer.finished == ["aborted", "done"]
    ctl.check_integrity(idle=True)
    ctl.on_finish(_req("last", REPEAT), later=True)
    ctl.settle()  # the loop, once idle
    assert proposer.finished[-1] == "last"


def test_a_burst_of_finished_requests_is_settled_over_the_next_launches():
    """A launch settles T.settle_tokens of finished text (the oldest requests first, at least one), or
    1/T.settle_spread of the backlog where that is more: a batch finishing at once does not stall one step."""
    ctl, proposer = _counting_controller()
    long = list(range(T.settle_tokens // 2 + 1))  # two of these are over the budget
    for i in range(8):
        ctl.on_finish(_req(f"f{i}", long), later=True)
    backlog = 8 * len(long)
    assert backlog // T.settle_spread < T.settle_tokens  # the plain budget holds for this backlog
    ctl.observe([])
    assert proposer.finished == ["f0", "f1"]  # the second one takes the settled text past the budget
    ctl.observe([])
    assert proposer.finished == ["f0", "f1", "f2", "f3"]
    ctl.settle()  # idle: everything
    assert proposer.finished == [f"f{i}" for i in range(8)]
    ctl.check_integrity(idle=True)
    big = [_req(f"b{i}", long) for i in range(4 * T.settle_spread)]
    for req in big:
        ctl.on_finish(req, later=True)
    ctl.observe([])  # a backlog of 4 * SPREAD requests: a 1/SPREAD share of it is 4 requests' text
    assert proposer.finished[8:] == ["b0", "b1", "b2", "b3"]
    ctl.settle()


def test_a_reused_rid_settles_its_finished_namesake_first():
    """The proposer keys its state by rid: a finished request not yet settled is let go of before a new
    request with its rid is shown to the proposer (or finishes itself), whatever the budget leaves."""
    ctl, proposer = _counting_controller()
    log = []
    proposer.on_finish = lambda req: log.append(("finish", req.rid, id(req)))
    proposer.observe = lambda reqs: log.append(("observe", [r.rid for r in reqs]))
    long = list(range(T.settle_tokens + 1))  # each one alone is over a launch's budget
    for i in range(3):
        ctl.on_finish(_req(f"f{i}", long), later=True)
    old = _req("x", REPEAT)
    ctl.on_finish(old, later=True)
    new = _req("x", REPEAT)
    ctl.observe([new])  # the budget reaches f0 only; the old "x" goes first all the same
    assert log == [("finish", "x", id(old)), ("finish", "f0", log[1][2]), ("observe", ["x"])]
    ctl.on_finish(new, later=True)
    third = _req("x", REPEAT)
    ctl.on_finish(third, later=True)  # a third "x" finishing: the second is settled at once
    assert log[-1] == ("finish", "x", id(new))
    ctl.settle()
    assert [e[1] for e in log if e[0] == "finish"] == ["x", "f0", "x", "f1", "f2", "x"]
    ctl.check_integrity(idle=True)


def test_the_controller_learns_which_steps_verify_on_padded_graphs():
    from types import SimpleNamespace

    from radixlm.runtime.config import EngineConfig
    from radixlm.runtime.speculative.setup import build_speculation

    config = EngineConfig.from_options(speculative_algorithm="NGRAM")
    cpu = SimpleNamespace(model=SimpleNamespace(decode_stack=object()))  # the CPU's one-call decode, no graphs
    ctl = build_speculation(config, cpu, context_len=1024)
    assert ctl.padded_rows == 0 and ctl.one_call_decode
    gpu = SimpleNamespace(model=SimpleNamespace(), verify_graphs=SimpleNamespace(max_bs=48))
    ctl = build_speculation(config, gpu, context_len=1024)
    assert ctl.padded_rows == 48 and not ctl.one_call_decode
