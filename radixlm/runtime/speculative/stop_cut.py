"""Drafts end where the request would: no verify tokens after a stop token or a stop string.

Runs in the scheduler process. A draft copied from earlier text runs on past the place where the
request stops (a few-shot completion stopped at "\n" is proposed "\n" and the next example's first
tokens, a chat answer its end-of-turn token and what followed it). Verification would discard those
tokens anyway, but each costs a token's compute in the verify step (where a verify step is
compute-bound, about half of a decode row's share of a step). The cut keeps the draft up to and
including the first token at which the request would finish (its stop token, or the token whose text
completes a stop string), so what verification produces is unchanged: the same tokens are accepted
up to that point and the request finishes there either way.

A stop string is matched on the draft tokens' own texts (with the last few output tokens' texts
before them, for a stop that straddles): a token split inside a multi-byte character can make that
text differ from the detokenizer's, which at worst leaves a few tokens uncut or cuts a draft short,
never changes an output. stop_regex is not looked at (a draft is only cut where that is cheap to
know).
"""

from __future__ import annotations

from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.speculative.text_lookup import TokenText
from radixlm.runtime.speculative.tuning import TUNING as T


class StopCut:
    def __init__(self, eos_token_ids: frozenset[int], text_of: TokenText | None = None):
        self.eos_token_ids = eos_token_ids
        self.text_of = text_of  # None: stop strings are not looked at

    def cut(self, req: Req, draft: list[int]) -> list[int]:
        """draft up to and including the first token at which req would finish by a stop."""
        params = req.params
        # A stop ends the request only once min_new_tokens are out: draft token i is output number
        # len(output_ids) + i + 1.
        first = max(0, params.min_new_tokens - len(req.output_ids) - 1)
        stop_ids = params.stop_token_ids
        for i in range(first, len(draft)):
            tok = draft[i]
            if (not params.ignore_eos and tok in self.eos_token_ids) or tok in stop_ids:
                draft = draft[: i + 1]
                break
        if params.stop and self.text_of is not None:
            end = self._stop_string_end(req, draft, first)
            if end is not None:
                draft = draft[: end + 1]
        return draft

    def _stop_string_end(self, req: Req, draft: list[int], first: int) -> int | None:
        """The index of the draft token whose text completes a stop string first (at `first` or later)."""
        if first >= len(draft):
            return None
        piece = self.text_of.piece
        tail = "".join(piece(t) for t in req.output_ids[-T.stop_tail_tokens :])
        ends, text = [], tail
        for tok in draft:
            text += piece(tok)
            ends.append(len(text))  # the text up to and including this draft token
        after = ends[first - 1] if first else len(tail)  # a stop must end past this character
        best = None
        for stop in req.params.stop:
            idx = text.find(stop, max(0, after - len(stop) + 1)) if stop else -1
            if idx >= 0 and (best is None or idx + len(stop) < best):
                best = idx + len(stop)
        if best is None:
            return None
        return next(i for i, end in enumerate(ends) if end >= best)
