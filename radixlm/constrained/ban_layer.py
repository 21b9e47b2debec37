"""A matcher around another matcher that removes some tokens from its mask: the base of the layers that
enforce, while generating, what a grammar cannot say (unique_items.py, number_layer.py).

Runs in the scheduler process. The wrapped grammar still decides what is well-formed; a layer reads the
accepted text with a JsonStream (one snapshot per token, for rollback) and names, once per state, the
allowed tokens to remove (`_find_bans`). A layer that fails is a bug, never the client's fault: it logs,
stops banning and leaves the constraint to the finished-output check (validate.py).
"""

from __future__ import annotations

import logging
from abc import abstractmethod

import numpy as np
import torch

from radixlm.constrained.base import GrammarMatcher
from radixlm.constrained.bitmask import num_words
from radixlm.constrained.json_stream import JsonStream

logger = logging.getLogger(__name__)
EMPTY = np.zeros(0, dtype=np.int64)


class BanLayer(GrammarMatcher):
    def __init__(self, inner: GrammarMatcher, stream: JsonStream, token_bytes: tuple[bytes | None, ...],
                 vocab_size: int):
        self._inner, self._stream, self._token_bytes, self._vocab = inner, stream, token_bytes, vocab_size
        self._history = [stream.state()]  # the reader's state after each accepted token
        self._words = np.zeros(num_words(vocab_size), dtype=np.int32)  # scratch for the inner mask
        self._version = 0
        self._bans, self._bans_at = EMPTY, -1
        self._broken = False

    @abstractmethod
    def _find_bans(self) -> np.ndarray:
        """Sorted token ids the inner grammar allows now that this layer removes."""

    @abstractmethod
    def _twin(self, inner: GrammarMatcher) -> "BanLayer":
        """A fresh layer of the same kind around `inner` (copy() then gives it this one's reader)."""

    # ---- masks --------------------------------------------------------------------------------------
    def banned(self) -> np.ndarray:
        """This state's bans (computed once per state)."""
        if self._bans_at != self._version:
            try:
                self._bans = EMPTY if self._broken else self._find_bans()
            except Exception:  # noqa: BLE001 - never take the scheduler down over an extra check
                self._fail()
                self._bans = EMPTY
            self._bans_at = self._version
        return self._bans

    def _fail(self) -> None:
        logger.warning("%s failed; its constraint is left to the output check", type(self).__name__,
                       exc_info=True)
        self._broken = True

    def _inner_words(self) -> np.ndarray:
        """The inner grammar's bitmask row for this state (bit t % 32 of word t // 32 = token t allowed)."""
        self._inner.fill_bitmask(torch.from_numpy(self._words))
        return self._words

    def _inner_allowed(self) -> np.ndarray:
        """The inner grammar's mask as one bool per token id."""
        bits = np.unpackbits(self._inner_words().view(np.uint8), bitorder="little").astype(bool)
        return bits[: self._vocab]

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
    def _advance(self, token_id: int) -> bool:
        """The inner grammar accepts the token, then the reader reads it."""
        if not self._inner.accept_token(token_id):
            return False
        data = self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else None
        if data and not self._broken:
            try:
                self._stream.feed(data)
            except Exception:  # noqa: BLE001 - see banned()
                self._fail()
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

    def copy(self) -> "BanLayer":
        twin = self._twin(self._inner.copy())
        twin._stream.text = bytearray(self._stream.text)
        twin._stream.restore(self._history[-1])
        twin._history, twin._broken = list(self._history), self._broken
        return twin
