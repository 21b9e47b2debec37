"""Own-text drafts stop where the request's copies end (copy_breaks.py): learned from copies inside the
prompt and from verified drafts."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.messages import FinishReason
from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.speculative import ngram_proposer as C
from radixlm.runtime.speculative.copy_breaks import CopyBreaks, Signatures
from radixlm.runtime.speculative.text_lookup import TokenText
from radixlm.sampling_params import SamplingParams


class _Tokenizer:
    """A toy record / JSON vocabulary (decode only: signatures read a token's first character)."""

    PIECES = {1: "Phone", 2: ":", 3: " +", 4: "1", 5: "-", 6: "5", 7: "0", 8: ".", 9: " Account", 10: ' "',
              11: '",', 12: "JSON", 13: "\n", 14: "2", 15: "3", 16: "com"}

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids)


def _req(ids) -> Req:
    params = SamplingParams(max_new_tokens=16, temperature=0)
    params.normalize()
    return Req(rid="a", input_ids=list(ids), params=params)


def test_signature_is_the_token_and_whether_the_next_starts_with_whitespace():
    sig = Signatures(TokenText(_Tokenizer()))
    seq = [16, 8, 9, 8, 16]  # 'com. Account.com'
    assert sig(seq, 1) == (8, True)  # a sentence's '.'
    assert sig(seq, 3) == (8, False)  # the '.' in 'example.com'
    assert sig(seq, 4) == (16, None)  # the last token: nothing after it
    assert Signatures(None)(seq, 1) == (8, 9)  # no tokenizer: the next token itself


def test_a_copy_inside_the_prompt_teaches_where_copies_end():
    breaks = CopyBreaks(Signatures(None))
    # a record's value [1..7] then '.', 40; its answer copies the value and closes it (11)
    prompt = [50, 1, 2, 3, 4, 5, 6, 7, 8, 40, 60, 1, 2, 3, 4, 5, 6, 7, 11, 61]
    breaks.learn_prompt(prompt, min_copy=6)
    # another record's value [21..27] then the same '.', 40: a draft copying it stops before the '.'
    seq = prompt + [50, 21, 22, 23, 24, 25, 26, 27, 8, 40, 60, 21]
    source = len(prompt) + 2  # the position of 22
    assert breaks.keep(seq, source, [22, 23, 24, 25, 26, 27, 8, 40]) == 6
    # a '.' before another token was never where a copy ended
    seq2 = prompt + [21, 22, 8, 41, 60, 21]
    assert breaks.keep(seq2, len(prompt) + 1, [22, 8, 41]) == 3
    # a draft that is not the source's text (a text lookup's retokenized draft) is not cut past the mismatch
    assert breaks.keep(seq, source, [22, 99, 8, 40]) == 4
    # a repeat shorter than min_copy teaches nothing
    short = CopyBreaks(Signatures(None))
    short.learn_prompt([1, 2, 3, 8, 40, 1, 2, 3, 11], min_copy=6)
    assert short.keep([1, 2, 3, 8, 40, 9, 1, 2], 2, [3, 8, 40]) == 3


def test_verified_drafts_teach_where_copies_end_and_where_they_go_on():
    breaks = CopyBreaks(Signatures(None))
    seq = [1, 2, 3, 4, 5, 6, 9, 1, 2]
    breaks.record(seq, 2, [3, 4, 5, 6], proposed=4, accepted=2)  # [3, 4] accepted, 5 (at 4) rejected
    assert breaks.keep(seq, 2, [3, 4, 5, 6]) == 2
    for _ in range(2):  # then copies went on through it twice: more than it ended
        breaks.record(seq, 2, [3, 4, 5, 6], proposed=4, accepted=4)
    assert breaks.keep(seq, 2, [3, 4, 5, 6]) == 4
    # a draft that differs from the source (text lookup) is tallied only up to where it differs
    fresh = CopyBreaks(Signatures(None))
    fresh.record(seq, 2, [3, 99, 5], proposed=3, accepted=0)
    fresh.record(seq, 2, [7, 4, 5], proposed=3, accepted=1)
    assert fresh.keep(seq, 2, [3, 4, 5, 6]) == 0  # [3] ended a copy once
    assert fresh._tally.keys() == {(3, 4)}


# A few-shot record (phone +1-555-0124) and its JSON answer, which closes the value where the record's
# sentence goes on; then this request's record (+1-555-0134) and the start of its answer.
SHOT_RECORD = [1, 2, 3, 4, 5, 6, 6, 6, 5, 7, 14, 4, 8, 9, 13]
SHOT_ANSWER = [12, 2, 10, 4, 5, 6, 6, 6, 5, 7, 14, 4, 11, 13]
RECORD = [1, 2, 3, 4, 5, 6, 6, 6, 5, 7, 15, 4, 8, 9, 13]
ANSWER = [12, 2, 10, 4, 5, 6, 6, 6, 5, 7, 15]


@pytest.mark.parametrize("large_batch", [False, True])
def test_own_text_drafts_stop_where_the_prompts_copies_ended(large_batch):
    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)
    shot_record, shot_answer, record, answer = SHOT_RECORD, SHOT_ANSWER, RECORD, ANSWER
    drafts = {}
    for name, shot in (("closes", shot_answer), ("goes on", shot_answer[:12] + [8, 9, 13])):
        prop = C.NgramProposer(config, _Tokenizer())
        prop.own_prior = 1.0  # not capped as weak (tested in test_speculative_verify.py)
        req = _req(shot_record + shot + record + answer[:-1])
        req.output_ids = answer[-1:]
        drafts[name] = prop.propose([req], [4], [True], large_batch)[0].tokens
        req.finish = FinishReason("length", length=0)
        prop.on_finish(req)
        prop.check_integrity(idle=True)
    assert drafts["goes on"] == [4, 8, 9, 13]  # the record's text after '3'
    assert drafts["closes"] == [4]  # ... stopped before the sentence's '.': the shot's answer closed there


def test_a_rejected_own_text_draft_teaches_the_next_one():
    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)
    prop = C.NgramProposer(config, _Tokenizer())
    req = _req([1, 2, 3, 4, 5, 6, 8, 9, 13, 1, 2, 3, 4])  # no copy inside: nothing learned yet
    assert prop.propose([req], [4], [True])[0].tokens == [5, 6, 8, 9]
    prop.on_verified(req, 4, 2)  # '.' (at 6) rejected
    assert prop.propose([req], [4], [True])[0].tokens == [5, 6]
    req.finish = FinishReason("length", length=0)
    prop.on_finish(req)
    prop.check_integrity(idle=True)


def test_observe_builds_what_a_lookup_needs_and_the_draft_stays_the_same():
    """Where a request's copies end (learned from its prompt) and, once it copies, its text for a text lookup
    are built when the scheduler indexes after a launch (where a GPU hides the work), not at the lookup
    before the next launch; the draft is the same either way."""
    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)
    drafts = []
    for observed in (False, True):
        prop = C.NgramProposer(config, _Tokenizer())
        prop.own_prior = 1.0
        req = _req(SHOT_RECORD + SHOT_ANSWER + RECORD + ANSWER[:-1])
        req.output_ids = ANSWER[-1:]
        req.num_spec_accepted = 1  # copying: its drafts have been accepted
        if observed:
            prop.observe([req])
            assert "a" in prop._breaks and prop._text["a"].ids == req.full_ids()
        drafts.append(prop.propose([req], [4], [True])[0].tokens)
        req.finish = FinishReason("length", length=0)
        prop.on_finish(req)
        prop.check_integrity(idle=True)
    assert drafts[0] == drafts[1] == [4]
