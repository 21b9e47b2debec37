"""Where a request's copies of its own text end: learned from the copies inside its prompt and from its drafts.

Runs in the scheduler process. A JSON answer copies values from a record, and the record goes on
past each value ('+1-555-0109' + '. Account: ...') where the answer closes it ('",'): an own-text
draft that runs past the value's end is rejected from there on. The prompt usually shows the same
change of format already (a few-shot record and its answer), and each own-text draft verified shows
it again. So each request keeps, per source signature, how many copies ended there and how many went
on, and its own-text drafts stop before the first source token whose signature ended more copies
than it continued.

A signature is a source token and whether the token after it starts with whitespace: the '.' ending
a record's sentence ('.', ' Account') ends copies, the '.' inside 'example.com' does not. Without a
tokenizer's text the next token itself stands in for its first character.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from radixlm.runtime.speculative.text_lookup import TokenText
from radixlm.runtime.speculative.tuning import TUNING as T


class Signatures:
    """sig(seq, i): what a source position looks like to CopyBreaks."""

    def __init__(self, text_of: TokenText | None):
        self.text_of = text_of

    def __call__(self, seq: Sequence[int], i: int) -> Hashable:
        if i + 1 >= len(seq):
            return seq[i], None
        if self.text_of is None:
            return seq[i], seq[i + 1]
        return seq[i], self.text_of.piece(seq[i + 1])[:1].isspace()


class CopyBreaks:
    """One request's tallies: signature -> [copies that ended there, copies that went on]."""

    def __init__(self, sig: Signatures):
        self.sig = sig
        self._tally: dict[Hashable, list[int]] = {}

    def _count(self, seq: Sequence[int], i: int, ended: bool) -> None:
        counts = self._tally.setdefault(self.sig(seq, i), [0, 0])
        counts[0 if ended else 1] += 1

    def learn_prompt(self, prompt: Sequence[int], min_copy: int = T.prompt_copy_min) -> None:
        """Tally the copies inside the prompt: each later occurrence of min_copy+ tokens, followed while it
        equals its first occurrence (the source), ends where they part."""
        first: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its first occurrence
        n, end = min_copy, min_copy
        while end <= len(prompt):
            src = first.setdefault(tuple(prompt[end - n : end]), end)
            if src == end:
                end += 1
                continue
            a, b = src, end  # prompt[src - n : src] == prompt[end - n : end]: follow the copy
            while b < len(prompt) and a < end - n and prompt[a] == prompt[b]:
                self._count(prompt, a, ended=False)
                a, b = a + 1, b + 1
            if b < len(prompt) and a < end - n:  # parted (not where the source ran into the copy)
                self._count(prompt, a, ended=True)
            for j in range(end + 1, b + 1):  # the copy's own n-grams: first occurrences come earlier
                first.setdefault(tuple(prompt[j - n : j]), j)
            end = b + 1

    def record(self, seq: Sequence[int], source: int, draft: Sequence[int], proposed: int, accepted: int) -> None:
        """A verified own-text draft (draft[:proposed] was seq[source:]'s continuation): the accepted tokens
        went on, the first rejected one ended the copy."""
        for i in range(min(accepted + 1, proposed, len(draft))):
            if source + i >= len(seq) or seq[source + i] != draft[i]:
                return  # a text lookup's retokenized draft: no source position from here on
            self._count(seq, source + i, ended=i == accepted)

    def keep(self, seq: Sequence[int], source: int, draft: Sequence[int]) -> int:
        """How many of draft's tokens (seq's continuation at source) come before a learned copy end."""
        for i, tok in enumerate(draft):
            if source + i >= len(seq) or seq[source + i] != tok:
                break
            ended, went_on = self._tally.get(self.sig(seq, source + i), (0, 0))
            if ended > went_on:
                return i
        return len(draft)
