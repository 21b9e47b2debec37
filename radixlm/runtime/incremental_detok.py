"""Incremental detokenization and stop-string / stop_regex search, shared by the scheduler (stop detection) and the
detokenizer (output text). Both run the same algorithm on the same ids, so they agree on the text.

Decoding a growing id list token by token is wrong for byte-level BPE (a character can span tokens) and
for SentencePiece (a token's leading space depends on its left context). So we decode a short window:
ids[prefix_offset:] against ids[prefix_offset:read_offset] and emit only the difference, and only once it
no longer ends in a replacement character (an incomplete UTF-8 sequence).
"""

from __future__ import annotations

from functools import lru_cache

import regex

# Prompt tokens used as left context, so the first output token decodes with its real leading space.
_CONTEXT_TOKENS = 4


class IncrementalDecoder:
    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self._tok = tokenizer
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._kwargs = {"skip_special_tokens": skip_special_tokens,
                        "spaces_between_special_tokens": spaces_between_special_tokens}
        self.text = ""
        self.num_pushed = 0  # output ids pushed so far

    def _decode(self, ids: list[int]) -> str:
        try:
            return self._tok.decode(ids, **self._kwargs)
        except TypeError:  # tokenizers without spaces_between_special_tokens
            return self._tok.decode(ids, skip_special_tokens=self._kwargs["skip_special_tokens"])

    def push(self, new_ids: list[int]) -> str:
        """Add output tokens; return the newly completed text (possibly "")."""
        self._ids.extend(new_ids)
        self.num_pushed += len(new_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of a request: emit whatever is pending, replacement characters included."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        delta = full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta


def find_stop(text: str, stops: list[str], start: int) -> tuple[str, int] | None:
    """Earliest occurrence of any stop string that ends after `start` (the text already scanned):
    returns (stop, char index) or None. Scans from start - len(stop) + 1 so a stop straddling the old
    and new text is found."""
    best: tuple[str, int] | None = None
    for stop in stops:
        idx = text.find(stop, max(0, start - len(stop) + 1))
        if idx >= 0 and (best is None or idx < best[1]):
            best = (stop, idx)
    return best


def holdback_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string: streaming holds
    it back, because the next token may complete the stop string (which is then trimmed)."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


# stop_regex: a match is looked for in the last this-many characters of the output (a match may not be
# longer), and one search may take at most this long (a pathological pattern must not stall the scheduler).
STOP_REGEX_WINDOW_CHARS = 4096
STOP_REGEX_TIMEOUT_S = 0.05


@lru_cache(maxsize=256)
def compile_stop_regex(pattern: str) -> regex.Pattern:
    """The `regex` module (not `re`): it reports partial matches at the end of the text (for hold-back)
    and can time a search out."""
    return regex.compile(pattern)


def find_stop_regex(text: str, patterns: list[str], start: int) -> tuple[str, int] | None:
    """Earliest non-empty match of any stop regex that ends after `start` (the text already scanned):
    returns (pattern, char index of the match) or None. Raises TimeoutError for a runaway pattern."""
    best: tuple[str, int] | None = None
    lo = max(0, start - STOP_REGEX_WINDOW_CHARS)
    for pattern in patterns:
        for m in compile_stop_regex(pattern).finditer(text, lo, timeout=STOP_REGEX_TIMEOUT_S):
            if m.end() > start and m.end() > m.start():
                if best is None or m.start() < best[1]:
                    best = (pattern, m.start())
                break
    return best


def regex_holdback_len(text: str, patterns: list[str]) -> int:
    """Length of the tail of `text` that is the start of a possible stop_regex match (a partial match
    running to the end of the text): streaming holds it back, like a stop string's prefix."""
    best = 0
    lo = max(0, len(text) - STOP_REGEX_WINDOW_CHARS)
    for pattern in patterns:
        try:
            for m in compile_stop_regex(pattern).finditer(text, lo, partial=True, timeout=STOP_REGEX_TIMEOUT_S):
                if m.partial:
                    best = max(best, len(text) - m.start())
        except TimeoutError:
            best = max(best, len(text) - lo)  # unsure: hold the window back (the scheduler ends it anyway)
    return best
