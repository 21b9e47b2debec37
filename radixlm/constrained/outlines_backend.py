"""The outlines-core grammar backend: compiled grammars and per-request matchers.

Runs in the scheduler process (matchers, loading compiled Index bytes) and in compile workers
(`compile`). See fsm.py for how the outlines-core Index is built and used.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from radixlm.constrained.base import CompiledGrammar, GrammarBackend, GrammarMatcher, GrammarOptions
from radixlm.constrained.bitmask import CpuMask, allowed_list, eos_only_bits
from radixlm.constrained.fsm import TokenFSM
from radixlm.constrained.specs import build_index_bytes
from radixlm.constrained.vocabulary import TokenBytes, outlines_vocabulary_bytes, token_bytes_for


def utf8_pending(pending: int, data: bytes) -> int:
    """Continuation bytes still owed after `data`, starting with `pending` owed (0 = char boundary)."""
    for b in data:
        if pending and 0x80 <= b < 0xC0:
            pending -= 1
        elif 0xC0 <= b < 0xE0:
            pending = 1
        elif 0xE0 <= b < 0xF0:
            pending = 2
        elif 0xF0 <= b < 0xF8:
            pending = 3
        else:
            pending = 0
    return pending


def complete_utf8_prefix(data: bytes) -> str:
    """The longest prefix of data that is whole UTF-8 characters, decoded."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class OutlinesMatcher(GrammarMatcher):
    """History of states (for rollback) plus UTF-8 position (jump-forward starts on a char boundary)."""

    def __init__(self, fsm: TokenFSM, jump_forward: bool):
        self._fsm = fsm
        self._jump = jump_forward
        self._states = [fsm.initial_state]
        self._pending = [0]   # UTF-8 continuation bytes owed after each prefix
        self._eos = [False]   # entry i: token i-1 was EOS

    @property
    def fsm(self) -> TokenFSM:
        return self._fsm

    @property
    def state(self) -> int:
        return self._states[-1]

    @property
    def num_accepted(self) -> int:
        return len(self._states) - 1

    def fill_allowed_mask(self, mask: torch.Tensor) -> None:
        # mask: bool [V_model]. A state with no token to follow allows only EOS (see fsm.py), which is
        # also what a terminated request gets (the scheduler should have finished it already).
        if self._eos[-1]:
            mask.zero_()
            mask[self._fsm.table.eos_token_id] = True
            return
        self._fsm.fill_mask(self.state, mask)

    def fill_bitmask(self, words: torch.Tensor) -> None:
        if self._eos[-1]:
            eos_only_bits(words, self._fsm.table.eos_token_id)
            return
        self._fsm.fill_bitmask(self.state, words)

    def cpu_mask(self) -> CpuMask | None:
        if self._eos[-1]:
            return allowed_list(torch.tensor([self._fsm.table.eos_token_id], dtype=torch.int64))
        return self._fsm.mask_row(self.state).cpu

    def accept_token(self, token_id: int) -> bool:
        if self._eos[-1]:
            return False
        if token_id == self._fsm.table.eos_token_id:
            if not self._fsm.info(self.state).accepting:
                return False
            self._push(self.state, self._pending[-1], True)
            return True
        nxt = self._fsm.next_state(self.state, token_id)
        if nxt is None:
            return False
        self._push(nxt, utf8_pending(self._pending[-1], self._fsm.table.token_bytes[token_id]), False)
        return True

    def _push(self, state: int, pending: int, eos: bool) -> None:
        self._states.append(state)
        self._pending.append(pending)
        self._eos.append(eos)

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self.num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} of {self.num_accepted} tokens")
        if num_tokens:
            del self._states[-num_tokens:], self._pending[-num_tokens:], self._eos[-num_tokens:]

    def is_terminated(self) -> bool:
        return self._eos[-1] or self._fsm.info(self.state).num_real_tokens == 0

    def is_accepting(self) -> bool:
        return self._fsm.info(self.state).accepting

    def jump_forward(self) -> str | None:
        if not self._jump or self._eos[-1] or self._pending[-1]:
            return None
        forced, _ = self._fsm.forced(self.state)
        text = complete_utf8_prefix(forced)
        return text or None

    def copy(self) -> "OutlinesMatcher":
        twin = OutlinesMatcher.__new__(OutlinesMatcher)
        twin._fsm, twin._jump = self._fsm, self._jump
        twin._states, twin._pending, twin._eos = list(self._states), list(self._pending), list(self._eos)
        return twin


class OutlinesGrammar(CompiledGrammar):
    def __init__(self, fsm: TokenFSM, options: GrammarOptions):
        self.fsm = fsm
        self.options = options

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self.fsm, self.options.jump_forward)


class OutlinesBackend(GrammarBackend):
    """Compiles with outlines-core for one tokenizer and model vocabulary size (V_model)."""

    name = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int, options: GrammarOptions | None = None):
        self.options = options or GrammarOptions()
        self.vocab_size = vocab_size
        self.table: TokenBytes = token_bytes_for(tokenizer)
        self.vocab_bytes = outlines_vocabulary_bytes(self.table)
        digest = hashlib.sha256(self.vocab_bytes).hexdigest()[:16]
        self._key = f"{self.name}:{digest}:{vocab_size}:{self.options.to_json()}"

    @property
    def cache_key(self) -> str:
        return self._key

    def compile(self, kind: str, spec: str) -> OutlinesGrammar:
        return self.load(build_index_bytes(kind, spec, self.options, self.vocab_bytes))

    def worker_init_messages(self) -> list[bytes]:
        """What a compile worker needs (worker.py wire format): backend name, options, Vocabulary bytes."""
        return [self.name.encode(), self.options.to_json().encode("utf-8"), self.vocab_bytes]

    def load(self, index_bytes: bytes) -> OutlinesGrammar:
        """A compiled grammar from Index bytes made by build_index_bytes (here or in a worker)."""
        from outlines_core import Index

        return OutlinesGrammar(TokenFSM(Index.from_binary(index_bytes), self.table, self.vocab_size),
                               self.options)
