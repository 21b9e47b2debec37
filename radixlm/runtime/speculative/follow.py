"""Follow a copy into another request's text: where a request's draft from another running request's tokens
was accepted, its next draft continues from there.

Runs in the scheduler process (NgramProposer). An n-gram lookup sees at most
speculative_ngram_max_match tokens of context, and the live table keeps the last request that wrote
each n-gram: right after a copied stretch, the same short suffix ('", "phone": "+1-5') continues
differently in the request's own prompt (its record, tokenized otherwise), in the few-shot answer
and in every other request's answer, and the lookup picks one of those. The request that was copying
one of them has a far longer match where it was copying: the source it followed, whose tokens still
agree with everything it has written since. So a cursor (the source's tokens, the position there
that matches the request's position) is kept per request, moved by what is accepted, and dropped as
soon as the request writes a token the source does not have (a value of its own, a departure). After
a departure the source is searched a little further on for the request's last tuning.resync_match
tokens: a JSON answer that wrote one value its own way ('"email": "jemel' for 'emeka') rejoins the
source after it ('.4@example.com", "city": ...'). Only other requests' text: the request's own text
has its own cursors (ngram.NgramIndex.lookup). The source's tokens are the list indexed when the
draft was proposed (a snapshot, which outlives the source request's end); a tenant's cursor only
ever points into its own namespace's text (LiveNgrams is per tenant).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.speculative.ngram import Proposal
from radixlm.runtime.speculative.tuning import TUNING as T


@dataclass
class Cursor:
    tokens: list[int]  # the source's tokens
    pos: int  # the position in tokens that corresponds to position `at` of the request's sequence
    at: int


class Follow:
    """Per request: the cursor it follows, this step's draft from another request's text, and where it
    left the source it followed (kept for a resync until it has written tuning.resync_window more tokens)."""

    def __init__(self) -> None:
        self._cursors: dict[str, Cursor] = {}
        self._drafts: dict[str, Cursor] = {}  # this step's drafts from another request's text (at: seq length)
        self._lost: dict[str, Cursor] = {}  # where a request left the source it followed (resync)

    def propose(self, rid: str, seq: list[int], k: int) -> Proposal:
        """Up to k tokens continuing the source rid follows, with the length of their agreement as the
        match. Where rid has written a token the source does not have, the cursor is dropped and the
        source searched on (_resync): empty until rid's last tokens occur there."""
        cur = self._cursors.get(rid) or self._resync(rid, seq)
        if cur is None:
            return Proposal([], 0)
        done = len(seq) - cur.at
        start = cur.pos + done
        same = _agree(cur, seq) if done >= 0 else 0
        if done < 0 or same < done or start >= len(cur.tokens):
            del self._cursors[rid]
            self._lost[rid] = Cursor(cur.tokens, cur.pos + same, cur.at + same)
            cur = self._resync(rid, seq)
            if cur is None:
                return Proposal([], 0)
            start = cur.pos
        match, most = 0, min(start, len(seq), T.follow_max_agreement)
        while match < most and cur.tokens[start - 1 - match] == seq[-1 - match]:
            match += 1
        return Proposal(cur.tokens[start : start + k], match, None, (cur.tokens, start))

    def _resync(self, rid: str, seq: list[int]) -> Cursor | None:
        """A cursor where the source rid left goes on with rid's last resync_match tokens, if it does soon (within
        resync_window tokens, for as long as rid has written at most that many since leaving it)."""
        lost = self._lost.get(rid)
        if lost is None:
            return None
        if len(seq) - lost.at > T.resync_window + T.resync_match:
            del self._lost[rid]
            return None
        match, window = T.resync_match, T.resync_window
        tail, tokens = seq[-match:], lost.tokens
        for end in range(lost.pos + match, min(len(tokens), lost.pos + window + match)):
            if tokens[end - match : end] == tail:
                del self._lost[rid]
                cur = self._cursors[rid] = Cursor(tokens, end, len(seq))
                return cur
        return None

    def drafted(self, rid: str, shared: tuple[list[int], int], seq_len: int) -> None:
        """rid's draft of this step starts at shared[1] of another request's tokens shared[0]."""
        self._drafts[rid] = Cursor(shared[0], shared[1], seq_len)

    def new_step(self) -> None:
        self._drafts.clear()  # a draft the controller dropped is never verified

    def verified(self, rid: str, accepted: int) -> None:
        draft = self._drafts.pop(rid, None)
        if draft is None:
            return
        if accepted > 0:
            self._cursors[rid] = Cursor(draft.tokens, draft.pos + accepted, draft.at + accepted)
            self._lost.pop(rid, None)
        elif self._cursors.pop(rid, None) is not None:
            self._lost[rid] = draft  # the draft came from the cursor: the request departs where it starts

    def finish(self, rid: str) -> None:
        for table in (self._cursors, self._drafts, self._lost):
            table.pop(rid, None)

    def __len__(self) -> int:
        return len(self._cursors) + len(self._drafts) + len(self._lost)


def _agree(cur: Cursor, seq: list[int]) -> int:
    """How many tokens after cur.pos the source and the request (from cur.at) have in common."""
    n = 0
    while cur.at + n < len(seq) and cur.pos + n < len(cur.tokens) and cur.tokens[cur.pos + n] == seq[cur.at + n]:
        n += 1
    return n
