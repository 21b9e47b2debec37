"""speculative/follow.py: a request copying another running request's text continues from where it copies,
drops the source where it writes otherwise, and rejoins it a little further on."""

from __future__ import annotations

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.messages import FinishReason
from radixlm.runtime.speculative.controller import SpecController
from radixlm.runtime.speculative.ngram_proposer import NgramProposer
from radixlm.runtime.speculative.follow import Follow
from radixlm.runtime.speculative.tuning import TUNING as T
from tests.runtime.test_speculative_verify import _req

SOURCE = [40, 41, 42, 53, 20, 21, 22, 23, 24, 30, 31, 32, 33, 34]


def _following(seq: list[int], start: int, accepted: int) -> Follow:
    """A Follow whose request (at len(seq)) had a draft from SOURCE[start:] with `accepted` tokens kept."""
    follow = Follow()
    follow.drafted("r", (SOURCE, start), len(seq))
    follow.verified("r", accepted)
    return follow


def test_an_accepted_draft_is_continued_where_the_request_agrees_with_its_source() -> None:
    seq = [9, 40, 41, 42]
    follow = _following(seq, 3, 2)  # [53, 20] accepted
    p = follow.propose("r", seq + [53, 20, 21], 3)  # ... and the target's own next token agrees too
    assert p.tokens == [22, 23, 24] and p.shared == (SOURCE, 6)
    assert p.match == 6  # [40 .. 21]: the request's 9 is not the source's
    assert p.source is None  # not the request's own text


def test_a_departure_drops_the_cursor_and_the_source_is_rejoined_soon_after() -> None:
    seq = [9, 40, 41, 42]
    follow = _following(seq, 3, 2)
    assert follow.propose("r", seq + [53, 20, 99], 3).tokens == []  # 99: the source has 21
    # The request writes on; once its last T.resync_match tokens occur in the source after where it left,
    # the copy goes on from there.
    later = seq + [53, 20, 99, 98, 30, 31][: 4 + T.resync_match]
    p = follow.propose("r", later, 3)
    assert later[-T.resync_match:] == SOURCE[11 - T.resync_match : 11]
    assert p.tokens == SOURCE[11:14] and p.match == T.resync_match
    follow.finish("r")
    assert len(follow) == 0


def test_the_source_is_not_searched_past_the_window() -> None:
    seq = [9, 40, 41, 42]
    follow = _following(seq, 3, 2)
    far = seq + [53, 20] + [99] * (T.resync_window + T.resync_match) + [30, 31]
    assert follow.propose("r", far, 3).tokens == []
    assert len(follow) == 0  # given up: nothing kept for the request


def test_a_rejected_draft_from_the_cursor_leaves_only_the_resync() -> None:
    seq = [9, 40, 41, 42]
    follow = _following(seq, 3, 2)
    grown = seq + [53, 20, 21]
    p = follow.propose("r", grown, 3)
    follow.new_step()
    follow.drafted("r", p.shared, len(grown))
    follow.verified("r", 0)  # none of [22, 23, 24] accepted: the request departs at 22
    assert follow.propose("r", grown + [77], 3).tokens == []
    assert follow.propose("r", grown + [77, 24, 30], 3).tokens == [31, 32, 33]  # rejoined after [24, 30]


def test_the_controller_prefers_the_followed_source_over_the_latest_writer() -> None:
    config = SpeculativeConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4,
                               speculative_ngram_min_match=2, speculative_ngram_max_match=3)
    ctl = SpecController(config, NgramProposer(config), context_len=1024)
    a = _req("a", SOURCE)  # e.g. a few-shot answer in another request's prompt
    c = _req("c", [53, 20, 21, 22, 77, 78, 79, 30, 31, 88, 89])  # shares short runs with it
    b = _req("b", [9, 40, 41, 42])
    running = [a, c, b]
    assert ctl.propose([b], running) == [[53, 20, 21, 22]]  # only A has [40, 41, 42]
    b.output_ids += [53, 20, 21]
    ctl.on_verified(b, 4, 2, 3)  # [53, 20] accepted, the target's 21 agrees with A
    # [53, 20, 21] (the longest match the tables keep) was written last by C, which goes on with 77.
    live = ctl.proposer.live.find("", b.full_ids(), 3, ctl.proposer._index(b))
    assert live is not None and live[0][live[1] : live[1] + 2] == [22, 77]
    assert ctl.propose([b], running) == [[22, 23, 24, 30]]
    b.output_ids += [22, 99]
    ctl.on_verified(b, 4, 1, 2)  # 22 accepted, then the target departs (99)
    b.output_ids += [30, 31]  # ... and comes back to A's text: C is the latest writer of [30, 31] too
    assert ctl.propose([b], running) == [[32, 33, 34]]
    for r in running:
        r.finish = FinishReason("length", length=0)
        ctl.on_finish(r)
    ctl.check_integrity(idle=True)
