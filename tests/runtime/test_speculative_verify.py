"""Speculative rejection sampling follows the target distribution exactly (statistical, fixed seeds), and
the n-gram proposer's lookups, against plain-Python references."""

from __future__ import annotations

import math

import pytest
import torch

from radixlm.runtime.sampling.sampler import Sampler, SamplingRow, make_generator
from radixlm.runtime.speculative.adaptive import AdaptiveState
from radixlm.runtime.speculative.drafts import Draft
from radixlm.runtime.speculative.ngram import (LiveNgrams, NgramCorpus, NgramIndex, Proposal, common_prefix,
                                              propose_ngram)
from radixlm.runtime.speculative.tuning import TUNING as T
from radixlm.runtime.speculative.verify import verify_sampled
from radixlm.sampling_params import SamplingParams

from tests.runtime.test_sampler import assert_distribution, hf_support, rand_logits

EOS = 5


def row(seed=None, output=(), **params) -> SamplingRow:
    p = SamplingParams(**params)
    p.normalize()
    return SamplingRow(params=p, prompt_ids=[1, 2], output_ids=list(output), generator=make_generator(seed))


def emitted(logits, draft, n, **params) -> tuple[list[int], int]:
    sampler = Sampler(logits.shape[-1], frozenset({EOS}))
    r = row(seed=7, **params)
    tokens, accepted = [], 0
    for _ in range(n):
        tok, ok = verify_sampled(sampler, logits, r, None, draft)
        tokens.append(tok)
        accepted += ok
        assert ok == (tok == draft)
    return tokens, accepted


def test_rejection_sampling_matches_softmax_for_a_likely_draft():
    logits = rand_logits(3, 1, 20, scale=1.0)
    probs = torch.softmax(logits[0] / 0.7, -1)
    draft = int(probs.argmax())
    tokens, accepted = emitted(logits, draft, 6000, temperature=0.7)
    assert_distribution(tokens, probs)
    assert abs(accepted / 6000 - float(probs[draft])) < 4 * math.sqrt(0.25 / 6000)  # P(accept) = p(draft)


def test_rejection_sampling_matches_filtered_distribution_for_an_unlikely_draft():
    logits = rand_logits(4, 1, 30, scale=1.0)
    support = hf_support(logits, 0.9, 12, 0.8, 0.05)[0]
    probs = torch.softmax((logits[0] / 0.9).masked_fill(~support, -math.inf), -1)
    outside = int(torch.nonzero(~support)[0])
    tokens, accepted = emitted(logits, outside, 4000, temperature=0.9, top_k=12, top_p=0.8, min_p=0.05)
    assert accepted == 0  # a draft outside top-k/top-p/min-p is never accepted
    assert_distribution(tokens, probs)
    inside = int(torch.nonzero(support)[-1])  # the least likely kept token
    tokens, _ = emitted(logits, inside, 4000, temperature=0.9, top_k=12, top_p=0.8, min_p=0.05)
    assert_distribution(tokens, probs)


def test_rejection_sampling_against_a_sampled_drafts_distribution():
    """A draft drawn from q (not a point mass) and verified against q: the emitted tokens follow p, and a
    draft is accepted with probability sum(min(p, q))."""
    from radixlm.runtime.speculative.verify import draft_probs, sample_draft

    logits = rand_logits(6, 1, 24, scale=1.0)
    draft_logits = logits[0] + rand_logits(7, 1, 24, scale=1.0)[0]  # a draft close to, not equal to, the target
    params = SamplingParams(temperature=0.8, top_k=10)
    params.normalize()
    q = draft_probs(draft_logits, params)
    support = hf_support(logits, 0.8, 10, 1.0, 0.0)[0]
    probs = torch.softmax((logits[0] / 0.8).masked_fill(~support, -math.inf), -1)
    assert int((q > 0).sum()) == 10 and abs(float(q.sum()) - 1) < 1e-9
    sampler = Sampler(24, frozenset({EOS}))
    r = row(seed=11, temperature=0.8, top_k=10)
    g = torch.Generator().manual_seed(12)
    tokens, accepted, n = [], 0, 6000
    for _ in range(n):
        x = sample_draft(q, g)
        tok, ok = verify_sampled(sampler, logits, r, None, x, q)
        assert ok == (tok == x) or not ok
        tokens.append(tok)
        accepted += ok
    assert_distribution(tokens, probs)
    overlap = float(torch.minimum(probs.double(), q).sum())
    assert abs(accepted / n - overlap) < 4 * math.sqrt(0.25 / n)


def test_rejection_sampling_applies_penalties_first():
    logits = rand_logits(5, 1, 16, scale=1.0)
    output = [3, 3, 9]
    shifted = logits[0].clone()
    shifted[3] -= 2 * 1.5  # frequency penalty: 1.5 per occurrence (OpenAI semantics)
    shifted[9] -= 1.5
    probs = torch.softmax(shifted, -1)
    sampler = Sampler(16, frozenset({EOS}))
    r = row(seed=3, output=output, temperature=1.0, frequency_penalty=1.5)
    tokens = [verify_sampled(sampler, logits, r, None, 3)[0] for _ in range(5000)]
    assert_distribution(tokens, probs)


def _reference_lookup(seq, n):
    """Latest earlier occurrence of seq's last n tokens (ending before the last position)."""
    suffix = seq[-n:]
    for end in range(len(seq) - 1, n - 1, -1):
        if seq[end - n : end] == suffix:
            return end
    return None


def test_ngram_index_equals_a_scan_as_the_sequence_grows():
    """Lookups read the indexed n-grams and scan the tail added since the last observe (tails of 0 to
    T.tail_scan_max tokens here; a longer one is indexed first): every occurrence is found, as by a scan of
    the whole sequence."""
    g = torch.Generator().manual_seed(0)
    seq: list[int] = []
    index, tails = NgramIndex(1, 4), set()
    for step in range(400):
        seq.append(int(torch.randint(0, 6, (1,), generator=g)))
        if step % 97 < 40 and step % 3 == 0:  # observed every third token, then not for 57 tokens
            index.observe(seq)
        tails.add(len(seq) - index._indexed)
        for n in range(1, 5):
            if n <= len(seq):
                assert index.lookup(seq, n) == _reference_lookup(seq, n), (len(seq), n)
                every = [e for e in range(n, len(seq)) if seq[e - n : e] == seq[-n:]]
                assert list(index.occurrences(seq, n)) == every, (len(seq), n)
    assert {0, 1, 2, T.tail_scan_max} <= tails


def test_an_adopted_index_is_the_one_indexing_gives():
    """A request that starts from another running request's index (their common prefix; adopt) ends with
    the tables, and the live table's entries, that indexing its tokens one by one gives, whoever wrote the
    live table before and after; and the donor's tables stay its own (they share lists)."""
    g = torch.Generator().manual_seed(0)

    def draw(vocab: int, n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    adopted = 0
    for _ in range(150):
        vocab = [2, 3, 7, 50][int(torch.randint(0, 4, (1,), generator=g))]
        base = draw(vocab, int(torch.randint(0, 150, (1,), generator=g)))
        donor_seq = base + draw(vocab, int(torch.randint(0, 40, (1,), generator=g)))
        seq = base + draw(vocab, int(torch.randint(0, 40, (1,), generator=g)))
        other, min_n = draw(vocab, 60), int(torch.randint(1, 4, (1,), generator=g))
        cut, split = len(donor_seq) // 2, len(seq) // 3
        states = []
        for adopt in (False, True):
            live = LiveNgrams()
            writer = NgramIndex(min_n, 8, live.table("ns"), 3)
            writer.observe(other)
            donor = NgramIndex(min_n, 8, live.table("ns"), 3)
            donor.observe(donor_seq[:cut])
            donor.observe(donor_seq)
            writer.observe(other + [1, 0, 1, 0])  # a later writer of some of the same n-grams
            new = NgramIndex(min_n, 8, live.table("ns"), 3)
            if adopt:
                adopted += new.adopt(donor, seq) > 0
            new.observe(seq[:split])
            new.observe(seq)
            donor.observe(donor_seq + [0, 1, 0, 1])  # the donor goes on
            names = {id(writer): "writer", id(donor): "donor", id(new): "new"}
            states.append((new._ends, new.indexed, donor._ends,
                           {key: (names[id(owner)], end) for key, (owner, end) in live._maps["ns"].items()}))
        assert states[0] == states[1]
    assert adopted > 100  # most histories share enough to adopt something
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 9], 4) == 3 and common_prefix([5], [5], 1) == 1


def test_a_new_request_adopts_a_running_ones_prefix_but_not_a_constrained_ones(monkeypatch):
    """NgramProposer: a request whose first tuning.adopt_min+ tokens a running request of its namespace holds starts
    from that index; a constrained request (its tokens can be replaced) or another tenant's is no donor."""
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.messages import FinishReason
    from radixlm.runtime.speculative import ngram_proposer as P

    prefix = [int(t) for t in torch.randint(0, 500, (T.adopt_min + 40,), generator=torch.Generator().manual_seed(1))]
    config = SpeculativeConfig(speculative_algorithm="NGRAM")
    for donor_grammar, namespace, adopts in ((None, "", True), (object(), "", False), (None, "other", False)):
        prop = P.NgramProposer(config)
        calls = []
        donor, new = _req("d", prefix + [1, 2, 3]), _req("n", prefix + [4, 5], namespace=namespace)
        donor.grammar = donor_grammar
        prop.observe([donor])
        adopt = NgramIndex.adopt
        monkeypatch.setattr(NgramIndex, "adopt", lambda self, *a: calls.append(a) or adopt(self, *a))
        prop.observe([new])
        monkeypatch.undo()
        assert bool(calls) == adopts
        fresh = NgramIndex(prop.short_n, prop.max_n)
        fresh.observe(new.full_ids())
        assert prop._own["n"]._ends == fresh._ends
        for req in (donor, new):
            req.finish = FinishReason("length", length=0)
            prop.on_finish(req)
        prop.check_integrity(idle=True)


def test_a_finished_requests_index_is_a_donor_for_the_next_turn(monkeypatch):
    """A request that finished normally leaves its index behind (tuning.donor_tokens of them at most): a next turn
    that begins with its whole sequence adopts it, in its namespace only; an aborted one leaves none, and a
    flush forgets them."""
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.messages import FinishReason
    from radixlm.runtime.speculative import ngram_proposer as P

    turn = [int(t) for t in torch.randint(0, 300, (T.adopt_min + 50,), generator=torch.Generator().manual_seed(2))]
    prop = P.NgramProposer(SpeculativeConfig(speculative_algorithm="NGRAM"))
    adopt, calls = NgramIndex.adopt, []
    monkeypatch.setattr(NgramIndex, "adopt", lambda self, donor, seq: calls.append(len(seq)) or adopt(self, donor, seq))

    def run(rid: str, ids: list[int], out: list[int], finish: str = "length", namespace: str = "") -> None:
        req = _req(rid, ids, namespace=namespace)
        prop.observe([req])
        req.output_ids = list(out)
        prop.observe([req])
        fresh = NgramIndex(prop.short_n, prop.max_n)
        fresh.observe(req.full_ids())
        assert prop._own[rid]._ends == fresh._ends
        req.finish = FinishReason(finish, length=len(out)) if finish == "length" else FinishReason(finish, message="x")
        prop.on_finish(req)
        prop.check_integrity(idle=True)

    run("t1", turn, [7, 8, 9])
    assert calls == []
    run("t2", turn + [7, 8, 9, 1, 2], [3])  # the next turn: the first one's prompt and answer, then more
    assert calls == [len(turn) + 5]
    run("t3", turn + [7, 8, 9, 1, 2], [3], namespace="other")  # another tenant's: indexed from scratch
    assert len(calls) == 1
    prop.flush()
    run("t4", turn + [7, 8, 9, 1, 2], [3], finish="abort")  # nothing kept after the flush, or from an abort
    run("t5", turn + [7, 8, 9, 1, 2], [3])
    assert len(calls) == 1 and not any(rid for rid in prop._own)
    for i in range(T.donor_tokens // len(turn) + 2):  # the kept indexes stay within tuning.donor_tokens
        run(f"f{i}", [i + 1000] + turn, [])
    prop.check_integrity(idle=True)


def test_propose_prefers_the_longest_match_and_uses_the_corpus_per_namespace():
    corpus = NgramCorpus(2, 4, k=3)
    corpus.add("a", [10, 11, 12, 13, 14, 15])
    seq = [1, 2, 3, 1, 2, 7, 10, 11, 12]
    # own text: [1, 2] -> 3 (a 2-gram); the corpus has the 3-gram [10, 11, 12] -> 13, 14, 15: longer wins
    assert propose_ngram(seq, NgramIndex(2, 4), corpus, "a", 3) == Proposal([13, 14, 15], 3)
    other = propose_ngram(seq, NgramIndex(2, 4), corpus, "b", 3)
    assert (other.tokens, other.match) == ([], 0)  # another tenant's text: never
    assert propose_ngram([1, 2, 3, 1, 2], NgramIndex(2, 4), corpus, "a", 3) == Proposal([3, 1, 2], 2, 2)


@pytest.mark.parametrize("own_min_n, min_n", [(1, 3), (3, 3), (3, 5)])
def test_the_shortest_suffix_probe_changes_no_proposal(monkeypatch, own_min_n, min_n):
    """propose_ngram first probes each source for the shortest wanted suffix and stops where none has it;
    over random text from a small vocabulary (many matches of every length), its proposals equal the
    longest-first search without that probe."""
    import radixlm.runtime.speculative.ngram as ngram

    g = torch.Generator().manual_seed(1)
    rand = lambda n: [int(t) for t in torch.randint(0, 5, (n,), generator=g)]  # noqa: E731
    corpus, live = NgramCorpus(3, 6, k=4), LiveNgrams()
    corpus.add("a", rand(60))
    other = NgramIndex(own_min_n, 6, live.table("a"), 3)
    other.observe(rand(60))
    own, seq = NgramIndex(own_min_n, 6, live.table("a"), 3), []
    probed, searched = [], []
    for tok in rand(200):
        seq.append(tok)
        probed.append(propose_ngram(seq, own, corpus, "a", 4, live, min_n))
        with monkeypatch.context() as m:
            m.setattr(ngram, "_occurs", lambda *a: True)
            searched.append(propose_ngram(seq, own, corpus, "a", 4, live, min_n))
    assert probed == searched
    assert sum(bool(p.tokens) for p in probed) >= 10 and sum(not p.tokens for p in probed) >= 10


def test_adaptive_turns_down_then_off_then_back():
    state = AdaptiveState(k=4)
    steps = 0
    while state.k > 1 or state.cooldown == 0:  # every proposal rejected
        assert state.wants_proposal()
        state.update(state.k, 0, 4, 0.25)
        steps += 1
    assert steps <= 5  # 4 -> 2 -> 1 -> off within a few steps
    skipped = 0
    while not state.wants_proposal():
        skipped += 1
    assert skipped == 8
    for _ in range(10):
        state.update(state.k, state.k, 4, 0.25)
    assert state.k == 4


def test_options_use_sglang_names_and_are_validated():
    import argparse

    import pytest

    from radixlm.runtime.cli_flags import ENGINE_CONFIGS, add_dataclass_flags, dataclass_values
    from radixlm.runtime.config import EngineConfig, SpeculativeConfig

    ap = argparse.ArgumentParser()
    for cls in ENGINE_CONFIGS:
        add_dataclass_flags(ap, cls)
    args = ap.parse_args(["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/d",
                          "--speculative-num-draft-tokens", "6", "--speculative-num-steps", "3"])
    spec = SpeculativeConfig(**dataclass_values(args, SpeculativeConfig))
    assert (spec.algorithm, spec.max_draft) == ("STANDALONE", 3)
    assert EngineConfig.from_options(speculative_algorithm="ngram").speculative.algorithm == "NGRAM"
    for bad in ({"speculative_algorithm": "EAGLE"}, {"speculative_algorithm": "STANDALONE"},
                {"speculative_num_draft_tokens": 0}, {"speculative_ngram_min_match": 9}):
        with pytest.raises(ValueError):
            SpeculativeConfig(**bad)


def test_dp_ranks_merge_speculative_rates_from_the_sums():
    from radixlm.runtime.server.dp_dispatch import _merge

    def rank(rows, proposed, accepted, per_row):
        return {"speculative": {"spec_verify_rows": rows, "spec_proposed_tokens": proposed,
                                "spec_accepted_tokens": accepted, "spec_acceptance_rate": accepted / proposed,
                                "spec_tokens_per_verify_row": per_row}}

    merged = _merge([rank(2, 8, 4, 3.0), rank(2, 8, 8, 5.0)])["speculative"]
    assert merged["spec_acceptance_rate"] == 0.75 and merged["spec_tokens_per_verify_row"] == 4.0


def _req(rid, ids, namespace="", max_new=16):
    from radixlm.runtime.scheduler.request import Req

    params = SamplingParams(max_new_tokens=max_new, temperature=0)
    params.normalize()
    return Req(rid=rid, input_ids=list(ids), params=params, namespace=namespace)



def test_running_requests_text_is_proposed_within_its_namespace_only():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.messages import FinishReason
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    # A (running, still prefilling: not decoding) holds a few-shot line; B's suffix [40, 41, 42] occurs
    # only in A's prompt, so B's draft can only come from A's text. C, another tenant, has the same suffix.
    a = _req("a", [1, 2, 3, 40, 41, 42, 50, 51, 52, 53, 54])
    b = _req("b", [7, 8, 9, 40, 41, 42])
    c = _req("c", [7, 8, 9, 40, 41, 42], namespace="other")
    assert ctl.propose([b, c], running=[a, b, c]) == [[50, 51, 52, 53], []]
    # What a running request generates is visible too, as it grows (incrementally indexed).
    a.output_ids += [60, 61, 62, 63, 64]
    b.output_ids += [50, 51, 52, 53, 54, 60, 61]
    assert ctl.propose([b], running=[a, b]) == [[62, 63, 64]]
    # A aborts: its text leaves the live table (an aborted request's text is not kept for the corpus).
    a.finish = FinishReason("abort", message="x")
    ctl.on_finish(a)
    assert ctl.propose([b], running=[b]) == [[]]
    for r in (b, c):
        r.finish = FinishReason("length", length=0)
        ctl.on_finish(r)
    ctl.check_integrity(idle=True)  # no index, no live table left
    assert not ctl.proposer.live._maps


def test_live_table_keeps_other_writers_when_one_leaves():
    live = LiveNgrams()
    a, b = NgramIndex(2, 3, live.table("t")), NgramIndex(2, 3, live.table("t"))
    a.observe([1, 2, 3, 4])
    b.observe([9, 1, 2, 5])  # [1, 2] -> now B's (latest writer)
    asker = NgramIndex(2, 3, live.table("t"))
    assert live.lookup("t", [0, 1, 2], 2, 4, asker) == [5]
    live.remove("t", a)  # A's leaving does not drop B's entries
    assert live.lookup("t", [0, 1, 2], 2, 4, asker) == [5]
    assert live.lookup("t", [0, 1, 2], 2, 4, b) == []  # never a request's own entry from the live table
    live.remove("t", b)
    assert live.lookup("t", [0, 1, 2], 2, 4, asker) == []
    live.remove("t", asker)
    assert len(live) == 0


def test_short_matches_only_while_copying_and_only_from_own_text():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=3)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    a = _req("a", [5, 6, 7, 20, 21, 22, 23])  # the 1-gram [20] continues 21, 22, 23 in a's own prompt
    other = _req("o", [30, 20, 40, 41, 42])  # ... and 40, 41, 42 in another running request's text
    a.output_ids = [9, 20]
    assert ctl.propose([a], running=[a, other]) == [[]]  # no draft of a's accepted yet: not copying
    a.num_spec_accepted = 1  # once one is, and while its acceptance average holds, it is
    assert ctl.propose([a], running=[a, other]) == [[21, 22, 23]]
    ctl.adaptive("a").acceptance = 0.2  # not copying (free text): a 1-token match is not enough
    assert ctl.propose([a], running=[a, other]) == [[]]
    b = _req("b", [5, 6, 7, 8])
    b.output_ids = [20]
    assert ctl.propose([b], running=[b, other]) == [[]]  # another request's text: min_match (3) only


def test_batch_cap_gives_draft_tokens_to_the_best_accepted_requests():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4,
                               speculative_max_batch_draft_tokens=6)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    reqs = [_req(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]) for i in range(3)]
    assert ctl.propose(reqs) == [[4, 5, 6, 7], [4, 5], []]  # equal acceptance: batch order
    ctl.adaptive("r2").acceptance = 0.9
    assert ctl.propose(reqs) == [[4, 5], [], [4, 5, 6, 7]]
    with pytest.raises(ValueError):
        SpeculativeConfig(speculative_max_batch_draft_tokens=0)


def test_large_batch_needs_a_longer_match_unless_copying():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    ctl.cost_aware = False  # the match-length rule alone (the cost gate: test_speculative_cost.py)
    three = [_req(f"t{i}", [1, 2, 3, 9, 8, 7, 1, 2, 3]) for i in range(T.large_batch)]  # a 3-gram repeat
    assert ctl.propose(three[:1]) == [[9, 8]]
    for r in three:
        ctl._state.setdefault(r.rid, AdaptiveState(k=2)).acceptance = 0.3  # not copying
    assert ctl.propose(three[:1]) == [[9, 8]]  # a small batch: min_match (3)
    assert ctl.propose(three) == [[]] * T.large_batch  # a large one: 5
    four = _req("f", [1, 2, 3, 4, 9, 8, 1, 2, 3, 4])
    ctl._state["f"] = AdaptiveState(k=2, acceptance=0.3)
    assert ctl.propose(three[1:] + [four])[-1] == []
    five = _req("v", [1, 2, 3, 4, 5, 9, 8, 1, 2, 3, 4, 5])
    ctl._state["v"] = AdaptiveState(k=2, acceptance=0.3)
    assert ctl.propose(three[1:] + [five])[-1] == [9, 8]
    for r in three:
        ctl.adaptive(r.rid).acceptance = 0.9  # copying: short matches again, whatever the batch
        r.num_spec_accepted = 1
    assert ctl.propose(three) == [[9, 8]] * T.large_batch


def test_a_missed_draft_ends_copying_for_the_next_one_at_a_large_batch():
    """A request whose last draft had no token accepted (its copy just ended) needs the non-copying match
    length for its next draft in a large step, however high its acceptance average; a hit makes it copying
    again, and a small step keeps the short matches."""
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    ctl.cost_aware = False  # the copying rule alone
    reqs = [_req(f"m{i}", [5, 6, 20, 21, 22, 7, 20]) for i in range(T.large_batch)]  # the 1-gram [20] repeats
    for r in reqs:
        ctl._state[r.rid] = AdaptiveState(k=2, acceptance=0.9)
        r.num_spec_accepted = 1
    assert ctl.propose(reqs) == [[21, 22]] * T.large_batch  # copying: a 1-token match is enough
    for r in reqs:
        ctl.adaptive(r.rid).update(2, 0, max_k=2, min_acceptance=0.25)  # a miss; the average stays high
        assert ctl.adaptive(r.rid).acceptance >= 0.35
    assert ctl.propose(reqs) == [[]] * T.large_batch
    assert ctl.propose(reqs[:1]) == [[21, 22]]  # a small step: copying still
    for r in reqs:
        ctl.adaptive(r.rid).update(2, 1, max_k=2, min_acceptance=0.25)  # a token of the next draft accepted
    assert ctl.propose(reqs) == [[21, 22]] * T.large_batch


def test_a_request_that_copied_before_keeps_its_own_min_match_at_a_large_batch():
    """A large step asks a request that is not copying for a match 2 tokens longer, unless it has had drafts
    accepted before: then its own text (not others') at speculative_ngram_min_match is proposed."""
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    ctl.cost_aware = False  # the match-length rule alone
    reqs = [_req(f"c{i}", [1, 2, 3, 9, 8, 7, 1, 2, 3]) for i in range(T.large_batch)]  # a 3-gram repeat
    lone = _req("z", [4, 5, 1, 2, 3])  # [1, 2, 3] only in the others' text
    for r in reqs + [lone]:
        ctl._state[r.rid] = AdaptiveState(k=2, acceptance=0.9)
        ctl.adaptive(r.rid).update(2, 0, max_k=2, min_acceptance=0.25)  # a miss: not copying in a large step
    assert ctl.propose(reqs) == [[]] * T.large_batch  # no draft accepted yet: 5 tokens asked
    for r in reqs + [lone]:
        r.num_spec_accepted = 1
    assert ctl.propose(reqs) == [[9, 8]] * T.large_batch  # copied before: its own text at 3
    assert ctl.propose(reqs[1:] + [lone])[-1] == []  # the others' text still needs 5


def test_a_copy_in_progress_continues_at_its_cursor_not_at_the_latest_occurrence():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    # [1, 2] occurs twice: continued by 3 (position 3) and by 4 (position 7, the latest).
    seq = [10, 1, 2, 3, 11, 1, 2, 4, 1, 2]
    index = NgramIndex(1, 4)
    assert index.lookup(seq, 2) == 7
    assert index.lookup(seq, 2, cursors=[1]) == 3  # the first occurrence at or after the cursor
    assert index.lookup(seq, 2, cursors=[5]) == 7
    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=2)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    # A template [5, 6, 7, 8, 9] copied in order; the request's own earlier copy [5, 6, 7, 0] is later text.
    req = _req("a", [5, 6, 7, 8, 9, 1, 5, 6, 7, 0, 2, 5])
    req.num_spec_accepted = 1  # copying: 1-token matches are proposed
    assert ctl.propose([req]) == [[6, 7]]  # the latest [5] -> 6, 7 (from position 7)
    req.output_ids += [6, 7]
    ctl.on_verified(req, 2, 2, 3)  # accepted: the copy continues after position 9 (the latest copy)
    assert ctl.propose([req]) == [[0, 2]]
    req2 = _req("b", [5, 6, 7, 8, 9, 1, 5, 6, 7, 0, 2, 3, 4, 5])
    req2.num_spec_accepted = 1
    ctl.propose([req2])
    ctl.proposer._source["b"] = (1, [6, 7])  # say this step's draft [6, 7] came from the template (position 1)
    req2.output_ids += [6]
    ctl.on_verified(req2, 2, 1, 2)  # one accepted: the cursor is at 2
    req2.output_ids += [7]
    assert ctl.propose([req2]) == [[8, 9]]  # [7] continues in the template, not after the latest copy (0)


class _WordTokenizer:
    """A toy tokenizer: fixed pieces, greedy longest-piece encoding."""

    PIECES = {1: " Alice", 2: " Johnson", 3: '"', 4: "Alice", 5: ".", 6: " x", 7: ",", 8: "J", 9: "ohnson"}

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids)

    def encode(self, text, add_special_tokens=False):
        out = []
        while text:
            tok = max((i for i, p in self.PIECES.items() if text.startswith(p)), key=lambda i: len(self.PIECES[i]))
            out.append(tok)
            text = text[len(self.PIECES[tok]) :]
        return out


def test_text_lookup_continues_a_copy_that_is_tokenized_differently():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.messages import FinishReason
    from radixlm.runtime.speculative.controller import SpecController
    from radixlm.runtime.speculative.ngram_proposer import NgramProposer

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=3)
    ctl = SpecController(config, NgramProposer(config, _WordTokenizer()), context_len=1024)
    req = _req("a", [1, 2, 5, 6, 7, 3])  # ' Alice Johnson. x,"'
    req.output_ids = [4]  # 'Alice' (after a quote): as a token it occurs nowhere earlier
    req.num_spec_accepted = 1  # copying
    assert ctl.propose([req]) == [[2, 5, 6]]  # the text 'Alice' continues ' Johnson. x'
    req.output_ids += [8]  # ... and the model wrote 'J' + 'ohnson' (another split of the same text)
    assert ctl.propose([req]) == [[9, 5, 6]]
    ctl.adaptive("a").acceptance = 0.2  # not copying: no short (1-token or text) lookups
    assert ctl.propose([req]) == [[]]
    plain = SpecController(config, NgramProposer(config), context_len=1024)  # no tokenizer: tokens only
    assert plain.propose([req]) == [[]]
    for c in (ctl, plain):
        req.finish = FinishReason("length", length=0)
        c.on_finish(req)
        c.check_integrity(idle=True)


def _kept(proposals):
    """The first proposal's tokens that a step pricing each draft token keeps (its fourth field)."""
    return proposals[0].tokens[: proposals[0].keep]


def test_own_text_drafts_are_capped_at_a_large_batch_until_they_are_accepted():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative import ngram_proposer as C

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=6)
    prop = C.NgramProposer(config)
    # [1..5] repeats (a match long enough for a large batch): the own text continues 6..11
    req = _req("a", list(range(1, 13)) + [1, 2, 3, 4, 5])
    whole = [6, 7, 8, 9, 10, 11]
    assert T.own_prior < T.own_weak_acceptance  # no record yet: capped (own text is often a different format)
    assert _kept(prop.propose([req], [6], [False], large_batch=True)) == whole[: T.own_weak_max_draft]
    assert prop.propose([req], [6], [False], large_batch=True)[0].tokens == whole  # what a padded step verifies
    assert prop.propose([req], [6], [False], large_batch=False)[0] == Draft(whole, 5, None, 6)  # a small batch: no cap
    prop.propose([req], [6], [False], large_batch=True)
    prop.on_verified(req, 2, 2)  # accepted whole: above the bar
    assert _kept(prop.propose([req], [6], [False], large_batch=True)) == whole
    for _ in range(2):  # two drafts rejected: the average falls below the bar again
        prop.propose([req], [6], [False], large_batch=True)
        prop.on_verified(req, 6, 0)
    assert prop.propose([req], [6], [False], large_batch=True)[0].tokens == []  # and the copy ended at 6 twice
    del prop._breaks["a"]  # forget where (test_speculative_copy_breaks.py): the cap alone
    assert _kept(prop.propose([req], [6], [False], large_batch=True)) == whole[: T.own_weak_max_draft]
    prop.on_finish(req)
    prop.check_integrity(idle=True)


def test_agreed_stops_where_another_occurrence_of_the_context_parts():
    # [5, 6] occurs at 1 (-> 7, 8, 9), at 6 (-> 7, 8, 3) and at the end (the context looked up)
    seq = [0, 5, 6, 7, 8, 9, 5, 6, 7, 8, 3, 5, 6]
    assert NgramIndex(1, 4).agreed(seq, [7, 8, 9, 4], source=3, n=2) == 2  # the occurrence at 6 parts after 7, 8
    assert NgramIndex(1, 4).agreed(seq, [7, 8, 3, 4], source=8, n=2) == 2  # the one at 1 parts there too
    assert NgramIndex(1, 4).agreed(seq, [7, 8, 9, 4], source=3, n=3) == 4  # [11, 5, 6] occurs nowhere else
    assert NgramIndex(1, 4).agreed([1, 2, 9, 1, 2], [9, 1], source=2, n=2) == 2  # no other occurrence
    assert NgramIndex(1, 4).agreed([1, 2, 9, 1, 2, 1, 2], [9, 1], source=2, n=2) == 0  # at 5 [1, 2] -> 1: parts at once
    assert NgramIndex(1, 4).agreed([1, 2, 9, 3, 1, 2], [9, 3, 1], source=2, n=2) == 3  # nothing else to compare


def test_own_text_drafts_stop_where_the_text_is_ambiguous_at_a_large_batch():
    from radixlm.runtime.config import SpeculativeConfig
    from radixlm.runtime.speculative import ngram_proposer as C

    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=6)
    prop = C.NgramProposer(config)
    prop.own_prior = 1.0  # not capped as weak (that cap is tested above)
    # A few-shot record [20, 21, value, 40, 41] and its answer [30, 31, 32, value, 50, 51], then this request's
    # record and the start of its answer: it copies its record's value [5, 7, 8], which ends like the
    # few-shot one [6, 7, 8]; the record goes on [40, 41] where the few-shot answer went on [50, 51].
    shot = [20, 21, 6, 7, 8, 40, 41, 30, 31, 32, 6, 7, 8, 50, 51]
    record = [20, 21, 5, 7, 8, 40, 41, 42]
    req = _req("a", shot + record + [30, 31, 32, 5, 7, 8])
    draft = prop.propose([req], [6], [True], large_batch=True)[0]
    tokens, match, keep = draft.tokens, draft.match, draft.keep
    whole = prop.propose([req], [6], [True], large_batch=False)[0].tokens
    assert whole[:3] == [40, 41, 42] and match == 3  # a small batch: the record's text, after [5, 7, 8]
    # The context [7, 8] went on [50, ...] in the few-shot answer: the draft stops there (at once), but
    # keeps tuning.own_agree_min tokens; the whole draft is what a padded verify step verifies
    assert keep == T.own_agree_min and tokens == whole
    prop.on_finish(req)
    prop.check_integrity(idle=True)
