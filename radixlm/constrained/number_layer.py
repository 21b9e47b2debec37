"""One-sided number bounds enforced while generating, over llguidance's free JSON number: a matcher around
an llguidance matcher that removes the tokens which would end a number outside its bound, or write a
number prefix that no completion brings back inside it.

Runs in the scheduler process: llguidance_backend.py wraps a json_schema grammar whose bounds
llguidance_compile.py handed over (number_bounds.hand_over). Why: llguidance writes a bounded number as a
range regex without an exponent and refuses valid numbers such as 1e+308 under `minimum: 0`; its free
number has the exponent, and number_bounds.py decides bounds on every spelling exactly. Only bounds
reached through properties / additionalProperties / items / prefixItems from the root are handed over, and
`bound_at` follows the same steps in the same schema, so every handed-over bound is found where llguidance
would apply it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixlm.constrained.ban_layer import EMPTY, BanLayer
from radixlm.constrained.base import CompiledGrammar, GrammarMatcher
from radixlm.constrained.json_stream import NUM, VALUE, JsonStream
from radixlm.constrained.number_bounds import bound_at, feasible, within
from radixlm.constrained.vocabulary import TokenBytes

_NUMBER_START = re.compile(rb"^[ \t\n\r]*[-0-9]")
_NUMBER_INSIDE = re.compile(rb"[:,\[][ \t\n\r]*[-0-9]")


@dataclass(frozen=True)
class NumberTokens:
    """Per-token facts for choosing which tokens can start or end a number (built once per tokenizer)."""

    token_bytes: tuple[bytes | None, ...]
    starts: np.ndarray   # ids whose text starts a value with a number
    inside: np.ndarray   # ids with `:`, `,` or `[` then a number inside them

    @classmethod
    def build(cls, table: TokenBytes) -> "NumberTokens":
        tb = table.token_bytes

        def ids(rx: re.Pattern) -> np.ndarray:
            return np.array([i for i, b in enumerate(tb) if b and rx.search(b)], dtype=np.int64)

        return cls(tb, ids(_NUMBER_START), ids(_NUMBER_INSIDE))


def lowered_schema(grammar_text: str) -> Any:
    """The JSON schema inside llguidance grammar text (what the lowering wrote)."""
    return json.loads(grammar_text)["grammars"][0]["json_schema"]


class NumberBoundsGrammar(CompiledGrammar):
    def __init__(self, inner: CompiledGrammar, schema: Any, tokens: NumberTokens, vocab_size: int):
        self._inner, self._schema, self.tokens, self.vocab_size = inner, schema, tokens, vocab_size
        self._bounds: dict[tuple, dict | None] = {}  # path -> bound, shared by this grammar's matchers

    def matcher(self) -> "NumberBoundsMatcher":
        return NumberBoundsMatcher(self._inner.matcher(), self)

    def bound(self, path: tuple) -> dict | None:
        if path not in self._bounds:
            if len(self._bounds) > 4096:
                self._bounds.clear()
            self._bounds[path] = bound_at(self._schema, path)
        return self._bounds[path]


class NumberBoundsMatcher(BanLayer):
    def __init__(self, inner: GrammarMatcher, grammar: NumberBoundsGrammar):
        super().__init__(inner, JsonStream(None), grammar.tokens.token_bytes, grammar.vocab_size)
        self._g = grammar

    def _twin(self, inner: GrammarMatcher) -> "NumberBoundsMatcher":
        return NumberBoundsMatcher(inner, self._g)

    def _find_bans(self) -> np.ndarray:
        """Allowed tokens that would end a number outside its bound or leave a prefix that cannot return."""
        stream, tokens = self._stream, self._g.tokens
        # Tokens that can reach a number: one that starts (or continues) a number here matters only when
        # this value has a bound; one with `:` `,` or `[` then a digit may start a number further on.
        here = stream.mode in (NUM, VALUE) and self._g.bound(stream.value_path()) is not None
        if not here and not tokens.inside.size:
            return EMPTY
        if here and stream.mode == NUM:  # every allowed token continues or ends this number
            allowed = np.flatnonzero(self._inner_allowed()).astype(np.int64)
        else:
            candidates = np.union1d(tokens.starts, tokens.inside) if here else tokens.inside
            candidates = candidates[candidates < self._vocab]
            words = self._inner_words()
            allowed = candidates[((words[candidates >> 5] >> (candidates & 31)) & 1).astype(bool)]
        bans = np.array([t for t in allowed.tolist() if self._leaves_bound(t)], dtype=np.int64)
        if here and stream.mode == NUM and bans.size and bans.size == allowed.size:
            return EMPTY  # a dead end (not with a satisfiable bound): the grammar decides, the output check reports
        return bans

    def _leaves_bound(self, token_id: int) -> bool:
        data = self._token_bytes[token_id] if token_id < len(self._token_bytes) else None
        if not data:
            return False
        stream = self._stream
        saved = stream.state()
        stream.finished = []
        try:
            stream.feed(data)
            for path, text in stream.finished:
                bound = self._g.bound(path)
                if bound is not None and not within(text, bound):
                    return True
            if stream.mode == NUM:
                bound = self._g.bound(stream.value_path())
                return bound is not None and not feasible(stream.partial_number(), bound)
            return False
        finally:
            stream.finished = None
            stream.restore(saved)

    def accept_token(self, token_id: int) -> bool:
        # The bans are computed here too (cached per state): a token fed without a mask (a draft being
        # checked, a document walked token by token) is held to the bound as well.
        if token_id in set(self.banned().tolist()):
            return False
        return self._advance(token_id)
