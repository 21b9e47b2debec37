"""StopCut (speculative/stop_cut.py): a draft ends at the first token where its request would stop (an EOS
or stop token, the token completing a stop string, a straddling one included), never before min_new_tokens
are out, and not at EOS when the request ignores it."""

from __future__ import annotations

from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.speculative.stop_cut import StopCut
from radixlm.runtime.speculative.text_lookup import TokenText
from radixlm.sampling_params import SamplingParams

EOS = 0
PIECES = {0: "</s>", 1: "a", 2: "b", 3: "\n", 4: "Rec", 5: "ord", 6: "}\n", 7: "x"}


class _Pieces:
    def decode(self, ids):
        return "".join(PIECES[i] for i in ids)


def _req(output_ids=(), **params) -> Req:
    return Req(rid="r", input_ids=[1, 2], params=SamplingParams(max_new_tokens=64, **params),
               output_ids=list(output_ids))


CUT = StopCut(frozenset({EOS}), TokenText(_Pieces()))


def test_stop_tokens_end_the_draft_after_them():
    assert CUT.cut(_req(), [1, 2, EOS, 4, 5]) == [1, 2, EOS]
    assert CUT.cut(_req(stop_token_ids=[2]), [1, 2, EOS]) == [1, 2]
    assert CUT.cut(_req(ignore_eos=True), [1, 2, EOS, 4]) == [1, 2, EOS, 4]
    assert CUT.cut(_req(), [1, 2, 4]) == [1, 2, 4]  # nothing to cut


def test_stop_strings_end_the_draft_at_the_token_completing_them():
    assert CUT.cut(_req(stop=["\n"]), [1, 6, 4, 5]) == [1, 6]  # "}\n" holds the stop
    assert CUT.cut(_req(stop=["Record"]), [1, 4, 5, 7]) == [1, 4, 5]  # a stop over two draft tokens
    assert CUT.cut(_req(stop=["xx", "b\n"]), [2, 3, 7, 7]) == [2, 3]  # the earliest of several
    assert CUT.cut(_req(output_ids=[4], stop=["Record"]), [5, 1, 2]) == [5]  # straddling the output's end
    assert CUT.cut(_req(output_ids=[3], stop=["\n"]), [1, 2]) == [1, 2]  # a stop already in the output: not the draft's
    assert StopCut(frozenset({EOS})).cut(_req(stop=["\n"]), [1, 3, 2]) == [1, 3, 2]  # no tokenizer: ids only


def test_no_cut_before_min_new_tokens():
    # Draft token i is output number len(output_ids) + i + 1: with 1 output and min_new_tokens=4, stops at
    # draft positions 0 and 1 do not end the request, one at position 2 or later does.
    req = _req(output_ids=[1], min_new_tokens=4, stop=["\n"])
    assert CUT.cut(req, [EOS, 3, 2, EOS, 1]) == [EOS, 3, 2, EOS]
    assert CUT.cut(req, [3, 3, 3, 1]) == [3, 3, 3]
    assert CUT.cut(_req(output_ids=[1], min_new_tokens=9), [EOS, 3]) == [EOS, 3]
