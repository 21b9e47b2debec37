"""`uniqueItems` on free values, enforced while generating: a matcher around any backend's matcher that
blocks the tokens which would complete an array item equal to an earlier one.

Runs in the scheduler process (GrammarManager wraps a json_schema request's matcher when its schema asks
for unique items). No grammar can say "unlike the earlier items" for free strings or objects, so every
backend approximates the keyword; here the grammar still decides what is well-formed and this layer only
removes duplicates from its mask. What it cannot catch (an item spelled with other escapes than
`json.dumps` writes, a dead end where every allowed token repeats an item) is still caught by validating
the finished output (validate.py), as before.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixlm.constrained.ban_layer import EMPTY, BanLayer
from radixlm.constrained.base import CompiledGrammar, GrammarMatcher
from radixlm.constrained.json_stream import AFTER, LIT, NUM, STR, VALUE, JsonStream, value_key
from radixlm.constrained.schema_scope import SchemaScope
from radixlm.constrained.vocabulary import TokenBytes

_LOOKAHEAD = 2  # tokens of lookahead for a forced repeat (one value token, then blanks)
_WHOLE_NUMBER = re.compile(rb"[0-9][0-9.eE+-]*[,}\] \t\n\r]")


@dataclass(frozen=True)
class TokenTable:
    """Per-token facts for choosing which tokens to try (built once per tokenizer)."""

    token_bytes: tuple[bytes | None, ...]
    quote: np.ndarray        # contains `"`
    two_quotes: np.ndarray   # contains two `"` (a whole string)
    closer: np.ndarray       # contains `}` or `]`
    ends_value: np.ndarray   # contains `,` `}` `]` or whitespace (ends a number)
    literal: np.ndarray      # after whitespace / commas, starts like true, false or null
    whole_number: np.ndarray  # digits then something that ends a number
    has_e: np.ndarray
    blank: np.ndarray        # only whitespace
    has_l: np.ndarray
    sorted_bytes: tuple[bytes, ...]  # every token's bytes, sorted, for prefix lookups
    sorted_ids: np.ndarray

    @classmethod
    def build(cls, table: TokenBytes) -> "TokenTable":
        tb = table.token_bytes

        def flags(pred) -> np.ndarray:
            return np.fromiter((b is not None and pred(b) for b in tb), dtype=bool, count=len(tb))

        pairs = sorted((b, i) for i, b in enumerate(tb) if b)
        return cls(
            token_bytes=tb,
            quote=flags(lambda b: b'"' in b),
            two_quotes=flags(lambda b: b.count(b'"') >= 2),
            closer=flags(lambda b: b"}" in b or b"]" in b),
            ends_value=flags(lambda b: any(c in b for c in b",}] \t\n\r")),
            literal=flags(lambda b: b.lstrip(b" ,\t\n\r")[:1] in (b"t", b"f", b"n")),
            whole_number=flags(lambda b: _WHOLE_NUMBER.search(b) is not None),
            has_e=flags(lambda b: b"e" in b),
            blank=flags(lambda b: not b.strip(b" \t\n\r")),
            has_l=flags(lambda b: b"l" in b),
            sorted_bytes=tuple(p[0] for p in pairs),
            sorted_ids=np.array([p[1] for p in pairs], dtype=np.int64),
        )

    def exactly(self, data: bytes) -> np.ndarray:
        lo = bisect.bisect_left(self.sorted_bytes, data)
        hi = lo
        while hi < len(self.sorted_bytes) and self.sorted_bytes[hi] == data:
            hi += 1
        return self.sorted_ids[lo:hi]

    def with_prefix(self, prefix: bytes) -> np.ndarray:
        lo = bisect.bisect_left(self.sorted_bytes, prefix)
        hi = lo
        while hi < len(self.sorted_bytes) and self.sorted_bytes[hi].startswith(prefix):
            hi += 1
        return self.sorted_ids[lo:hi]


def _follow(value: Any, path: list) -> Any:
    """value[p0][p1]... or None where the path leaves it."""
    for step in path:
        if isinstance(value, dict) and isinstance(step, str) and step in value:
            value = value[step]
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return None
    return value


def _spelled(key: tuple) -> bytes | None:
    """How json.dumps writes a string's content or a number (what a model writes), by value_key."""
    if key[0] == "s":
        return json.dumps(key[1], ensure_ascii=False)[1:-1].encode("utf-8")
    if key[0] == "n":
        return json.dumps(key[1]).encode("ascii")
    return None


def wants_unique_items(spec: str) -> bool:
    """Cheap pre-check on the schema text before parsing it."""
    return '"uniqueItems"' in spec


class UniqueItemsGrammar(CompiledGrammar):
    def __init__(self, inner: CompiledGrammar, schema: Any, table: TokenTable, vocab_size: int):
        self._inner, self._scope, self._table, self._vocab = inner, SchemaScope(schema), table, vocab_size

    def matcher(self) -> "UniqueItemsMatcher":
        return UniqueItemsMatcher(self._inner.matcher(), self._scope, self._table, self._vocab)


class UniqueItemsMatcher(BanLayer):
    def __init__(self, inner: GrammarMatcher, scope: SchemaScope, table: TokenTable, vocab_size: int):
        super().__init__(inner, JsonStream(scope), table.token_bytes, vocab_size)
        self._scope, self._table = scope, table

    def _twin(self, inner: GrammarMatcher) -> "UniqueItemsMatcher":
        return UniqueItemsMatcher(inner, self._scope, self._table, self._vocab)

    def _find_bans(self) -> np.ndarray:
        bans, allowed = self._completing_bans()
        if allowed is None:
            return bans
        bans = np.union1d(bans, self._dead_end_bans(allowed, bans, 0))
        if bans.size >= int(allowed.sum()):
            return EMPTY  # a dead end: let the grammar have its way; the output check reports it
        return bans

    def _completing_bans(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Allowed tokens that would complete a duplicate now, and the allowed mask (None: nothing to do)."""
        stream = self._stream
        frame = stream.pending_unique()
        if frame is None:
            return EMPTY, None
        allowed = self._inner_allowed()
        partial = stream.partial_string(frame)
        if partial is not None:
            bans = self._string_bans(frame, partial)
            bans = bans[bans < self._vocab]
            return bans[allowed[bans]], allowed
        tried = np.flatnonzero(allowed[: len(self._table.token_bytes)] & self._candidates(frame))
        return np.array([t for t in tried if self._completes_duplicate(int(t))], dtype=np.int64), allowed

    def _dead_end_bans(self, allowed: np.ndarray, banned: np.ndarray, depth: int) -> np.ndarray:
        """One step of lookahead: a token that finishes the string or number being read so that it spells
        the same value as in an earlier item (at the same place inside it) is blocked when, after it, the
        grammar allows only tokens that complete the duplicate: `13` + `0` after an earlier 130 under
        `maximum: 999`, or the last member of a closed object (`"Value": "b"` + `"` before `}`). Blank
        tokens are tried too: `[ ]?` before a forced `}` must not walk into the dead end either."""
        stream = self._stream
        frame = stream.pending_unique()
        skip = set(banned.tolist())
        blank = np.flatnonzero(allowed[: len(self._table.token_bytes)] & self._table.blank)
        found = {int(t) for t in blank if int(t) not in skip and self._is_dead_end_after(int(t), depth)}
        scalar = stream.partial_scalar()
        path = stream.path_in_item(frame) if scalar is not None else None
        if path is None:
            return np.array(sorted(found), dtype=np.int64)
        kind, partial = scalar
        for value in frame.values:
            key = value_key(_follow(value, path))
            spelled = _spelled(key) if key[0] == kind else None
            if spelled is None or not spelled.startswith(partial) or (kind == "n" and spelled == partial):
                continue
            rest = spelled[len(partial):]
            tokens = self._table.exactly(rest) if kind == "n" else self._table.with_prefix(rest + b'"')
            for t in tokens:
                if (t < self._vocab and allowed[t] and int(t) not in found | skip
                        and self._is_dead_end_after(int(t), depth)):
                    found.add(int(t))
        return np.array(sorted(found), dtype=np.int64)

    def _is_dead_end_after(self, token_id: int, depth: int) -> bool:
        twin = self.copy()
        return twin.accept_token(token_id) and twin._no_way_out(depth + 1)

    def _no_way_out(self, depth: int) -> bool:
        """Every token the grammar allows here completes a duplicate, or is blank and leads to such a
        state (looked into at most _LOOKAHEAD blank tokens deep)."""
        bans, allowed = self._completing_bans()
        if allowed is None or not bans.size:
            return False
        escapes = np.setdiff1d(np.flatnonzero(allowed), bans)
        if not escapes.size:
            return True
        if depth >= _LOOKAHEAD:
            return False
        n = len(self._table.token_bytes)
        return all(t < n and self._table.blank[t] and self._is_dead_end_after(int(t), depth) for t in escapes)

    def _string_bans(self, frame, partial: bytes) -> np.ndarray:
        """Tokens that close the string being read so that it spells an earlier item (as json.dumps
        writes it): the rest of that item's encoding, then the closing quote."""
        found = []
        for key in frame.seen:
            spelled = _spelled(key) if key[0] == "s" else None
            if spelled is not None and spelled.startswith(partial):
                found.append(self._table.with_prefix(spelled[len(partial):] + b'"'))
        return np.unique(np.concatenate(found)) if found else EMPTY

    def _candidates(self, frame) -> np.ndarray:
        """Tokens that could possibly complete an item of `frame` (each is then tried on a copy)."""
        t, stream = self._table, self._stream
        if frame is not stream.stack[-1]:
            return t.closer  # the item is a container still open above: only a closing bracket ends it
        if stream.mode == NUM:
            return t.ends_value
        if stream.mode == LIT:
            return t.has_e if stream.lit_left.endswith(b"e") else t.has_l
        if stream.mode in (VALUE, AFTER):  # a whole short item inside one token
            return t.two_quotes | t.whole_number | t.literal | t.closer
        return t.quote if stream.mode == STR else t.closer

    def _completes_duplicate(self, token_id: int) -> bool:
        data = self._table.token_bytes[token_id]
        if not data:
            return False
        stream = self._stream
        saved = stream.state()
        stream.duplicate = False
        try:
            stream.feed(data)
            return stream.duplicate
        finally:
            stream.restore(saved)

    # ---- advancing ----------------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        # Only a mask computed for this state bans (forced jump-forward text is never refused here).
        if self._bans_at == self._version and self._bans.size and token_id in set(self._bans.tolist()):
            return False
        return self._advance(token_id)
