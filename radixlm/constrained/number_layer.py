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
import logging
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixlm.constrained.base import CompiledGrammar, GrammarMatcher
from radixlm.constrained.bitmask import num_words
from radixlm.constrained.json_stream import NUM, VALUE, JsonStream
from radixlm.constrained.number_bounds import bound_at, feasible, within
from radixlm.constrained.vocabulary import TokenBytes

logger = logging.getLogger(__name__)
_EMPTY = np.zeros(0, dtype=np.int64)
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
        self._inner, self._schema, self._tokens, self._vocab = inner, schema, tokens, vocab_size
        self._bounds: dict[tuple, dict | None] = {}  # path -> bound, shared by this grammar's matchers

    def matcher(self) -> "NumberBoundsMatcher":
        return NumberBoundsMatcher(self._inner.matcher(), self)

    def bound(self, path: tuple) -> dict | None:
        if path not in self._bounds:
            if len(self._bounds) > 4096:
                self._bounds.clear()
            self._bounds[path] = bound_at(self._schema, path)
        return self._bounds[path]


class NumberBoundsMatcher(GrammarMatcher):
    def __init__(self, inner: GrammarMatcher, grammar: NumberBoundsGrammar):
        self._inner, self._g = inner, grammar
        self._stream = JsonStream(None)
        self._history = [self._stream.state()]  # the reader's state after each accepted token
        self._words = np.zeros(num_words(grammar._vocab), dtype=np.int32)
        self._version = 0
        self._bans, self._bans_at = _EMPTY, -1
        self._broken = False  # the reader failed (a bug, never the client's fault): plain grammar from here

    # ---- masks --------------------------------------------------------------------------------------
    def banned(self) -> np.ndarray:
        """Token ids the grammar allows now that would leave a number outside its bound (cached per state)."""
        if self._bans_at != self._version:
            try:
                self._bans = _EMPTY if self._broken else self._find_bans()
            except Exception:  # noqa: BLE001 - never take the scheduler down over an extra check
                logger.warning("number layer: reader failed, bounds left to the output check", exc_info=True)
                self._broken, self._bans = True, _EMPTY
            self._bans_at = self._version
        return self._bans

    def _find_bans(self) -> np.ndarray:
        stream, tokens = self._stream, self._g._tokens
        # Tokens that can reach a number: one that starts (or continues) a number here matters only when
        # this value has a bound; one with `:` `,` or `[` then a digit may start a number further on.
        here = stream.mode in (NUM, VALUE) and self._g.bound(stream.value_path()) is not None
        if not here and not tokens.inside.size:
            return _EMPTY
        self._inner.fill_bitmask(torch.from_numpy(self._words))
        if here and stream.mode == NUM:
            candidates = self._set_bits()
        elif here:
            candidates = np.union1d(tokens.starts, tokens.inside)
        else:
            candidates = tokens.inside
        candidates = candidates[candidates < self._g._vocab]
        allowed = candidates[((self._words[candidates >> 5] >> (candidates & 31)) & 1).astype(bool)]
        bans = np.array([t for t in allowed.tolist() if self._leaves_bound(t)], dtype=np.int64)
        if here and stream.mode == NUM and bans.size and bans.size == allowed.size:
            return _EMPTY  # a dead end (not with a satisfiable bound): the grammar decides, the output check reports
        return bans

    def _set_bits(self) -> np.ndarray:
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self._g._vocab]).astype(np.int64)

    def _leaves_bound(self, token_id: int) -> bool:
        data = self._g._tokens.token_bytes[token_id] if token_id < len(self._g._tokens.token_bytes) else None
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

    def fill_allowed_mask(self, mask: torch.Tensor) -> None:
        self._inner.fill_allowed_mask(mask)
        bans = self.banned()
        if bans.size:
            mask[torch.from_numpy(bans)] = False

    def fill_bitmask(self, words: torch.Tensor) -> None:
        self._inner.fill_bitmask(words)
        bans = self.banned()
        if not bans.size:
            return
        row = words.detach().cpu().numpy().copy().view(np.uint32)
        np.bitwise_and.at(row, bans >> 5, ~(np.uint32(1) << (bans & 31).astype(np.uint32)))
        words.copy_(torch.from_numpy(row.view(np.int32)))

    def cpu_mask(self):
        return None if self.banned().size else self._inner.cpu_mask()

    # ---- advancing ----------------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        # The bans are computed here too (cached per state): a token fed without a mask (a draft being
        # checked, a document walked token by token) is held to the bound as well.
        if token_id in set(self.banned().tolist()):
            return False
        if not self._inner.accept_token(token_id):
            return False
        if not self._broken:
            table = self._g._tokens.token_bytes
            data = table[token_id] if 0 <= token_id < len(table) else None
            try:
                if data:
                    self._stream.feed(data)
            except Exception:  # noqa: BLE001 - see banned()
                logger.warning("number layer: reader failed, bounds left to the output check", exc_info=True)
                self._broken = True
        self._history.append(self._stream.state())
        self._version += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        self._inner.rollback(num_tokens)
        if num_tokens:
            del self._history[-num_tokens:]
            self._stream.restore(self._history[-1])
            self._version += 1

    def is_terminated(self) -> bool:
        return self._inner.is_terminated()

    def is_accepting(self) -> bool:
        return self._inner.is_accepting()

    def jump_forward(self) -> str | None:
        return self._inner.jump_forward()

    def copy(self) -> "NumberBoundsMatcher":
        twin = NumberBoundsMatcher(self._inner.copy(), self._g)
        twin._stream.text = bytearray(self._stream.text)
        twin._stream.restore(self._history[-1])
        twin._history, twin._broken = list(self._history), self._broken
        return twin
