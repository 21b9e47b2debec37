"""Prompt lookup on the text, for copies the token n-grams miss: the same characters tokenized differently.

Runs in the scheduler process. A value copied from a document into JSON starts after a quote, not
after a space: the record's ' Alice', ' Johnson' becomes '"', 'Alice', ' Johnson' (and ' alice.0'
becomes ' "al', 'ice', '.0'), so right after the first token of a copied value the request's token
suffix occurs nowhere earlier, while its last characters do. TextIndex keeps the request's text
(prompt + output, token by token) and proposes the tokenization of what follows the longest earlier
occurrence of its last characters (at least `min_chars`, the first occurrence after a cursor
preferred, as ngram.NgramIndex does). The proposal is a guess like any other: verification keeps
only what the target model produces itself.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Sequence

from radixlm.runtime.speculative.ngram import Proposal, nearest_after
from radixlm.runtime.speculative.tuning import TUNING as T


class TokenText:
    """Each token id's text (cached) and text -> ids, from a Hugging Face tokenizer."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._pieces: dict[int, str] = {}

    def piece(self, tok: int) -> str:
        text = self._pieces.get(tok)
        if text is None:
            text = self._pieces[tok] = self._tok.decode([tok])
        return text

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)


class TextIndex:
    """One request's text, grown token by token; offsets[i] is where token i's text starts."""

    def __init__(self, text_of: TokenText):
        self.text_of = text_of
        self.ids: list[int] = []
        self.offsets: list[int] = [0]
        self._parts: list[str] = []
        self._text = ""  # the first _joined parts, joined (at a lookup: observe only decodes the new pieces)
        self._joined = 0

    def _update(self, seq: list[int]) -> None:
        if len(seq) < len(self.ids) or (self.ids and seq[len(self.ids) - 1] != self.ids[-1]):
            self._truncate(seq)  # output tokens were replaced (grammar jump-forward re-tokenized them)
        new = seq[len(self.ids) :]
        if not new:
            return
        for tok in new:
            part = self.text_of.piece(tok)
            self._parts.append(part)
            self.offsets.append(self.offsets[-1] + len(part))
        self.ids.extend(new)

    def _truncate(self, seq: list[int]) -> None:
        keep = 0
        while keep < min(len(seq), len(self.ids)) and seq[keep] == self.ids[keep]:
            keep += 1
        del self.ids[keep:], self.offsets[keep + 1 :], self._parts[keep:]
        self._joined = min(self._joined, keep)
        self._text = self._text[: self.offsets[self._joined]]

    def text(self) -> str:
        """The text of every token taken so far."""
        if self._joined < len(self._parts):
            self._text += "".join(self._parts[self._joined :])
            self._joined = len(self._parts)
        return self._text

    def observe(self, seq: list[int]) -> None:
        """Take seq's new tokens' text (so a lookup's own update is short)."""
        self._update(seq)

    def propose(self, seq: list[int], k: int, min_chars: int, cursors: Sequence[int] = ()) -> Proposal:
        """Up to k tokens continuing seq's text after an earlier occurrence of its last characters."""
        self._update(seq)
        text = self.text()
        ends = self._occurrences(text, min_chars)
        if not ends:
            return Proposal([], 0)
        match, ends = ends
        end = self._near_cursor(ends, cursors) or ends[0]
        cont = text[end : end + T.chars_per_token * k]
        tokens = self.text_of.encode(cont)[:k] if cont else []
        if not tokens:
            return Proposal([], 0)
        # The cursor counts tokens: the token holding the continuation's first character.
        return Proposal(tokens, match, bisect_right(self.offsets, end) - 1)

    @staticmethod
    def _occurrences(text: str, min_chars: int) -> tuple[int, list[int]] | None:
        """(m, the ends of the earlier occurrences of text's last m characters, latest first) for the
        largest m in [min_chars, tuning.text_max_chars] that has one (a longer suffix only occurs where a
        shorter does)."""
        best = None
        limit = len(text) - 1  # an occurrence must end before the text does
        for m in range(min_chars, min(T.text_max_chars, len(text) - 1) + 1):
            pos = text.rfind(text[-m:], 0, limit)
            if pos < 0:
                break
            best = m
        if best is None:
            return None
        suffix, ends = text[-best:], []
        pos = text.rfind(suffix, 0, limit)
        while pos >= 0 and len(ends) < 64:
            ends.append(pos + best)
            pos = text.rfind(suffix, 0, pos + best - 1)
        return best, ends

    def _near_cursor(self, ends: list[int], cursors: Sequence[int]) -> int | None:
        """The earliest occurrence end at or after a cursor (cursors count tokens), within tuning.cursor_window."""
        last = len(self.offsets) - 1
        spans = [(self.offsets[c], self.offsets[min(c + T.cursor_window, last)]) for c in cursors if c <= last]
        return nearest_after(sorted(ends), spans)
