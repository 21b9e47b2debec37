"""The llguidance grammar backend: regex, JSON schema, choices, json_object and EBNF (GBNF or Lark)
through llguidance's Earley parser, with its forced bytes as jump-forward.

Runs in the scheduler process (matchers) and in its grammar-cache dispatcher threads (`load`). The
compile workers run llguidance_compile.py and send back checked grammar text; `load` builds one
LLMatcher from it in the dispatcher thread (llguidance drops the GIL while it builds), and each request's
matcher is a deep copy of that one, which costs microseconds on the scheduler loop.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from radixlm.constrained.base import CompiledGrammar, GrammarBackend, GrammarMatcher, GrammarOptions
from radixlm.constrained.bitmask import CpuMask, allowed_list, eos_only_bits, num_words
from radixlm.constrained.errors import INVALID_GRAMMAR, GrammarError
from radixlm.constrained.llguidance_compile import (compile_serialized, parser_limits, tokenizer_from_payload,
                                                    tokenizer_payload)
from radixlm.constrained.number_bounds import MARK
from radixlm.constrained.number_layer import NumberBoundsGrammar, NumberTokens, lowered_schema
from radixlm.constrained.outlines_backend import complete_utf8_prefix
from radixlm.constrained.vocabulary import token_bytes_for

# A mask that allows at most this many tokens goes to the sampler as its id list (bitmask.py).
MAX_LIST_IDS = 512
_BIT_OFFSETS = np.arange(32, dtype=np.int64)


def ids_of_words(words: np.ndarray, nz: np.ndarray | None = None) -> np.ndarray:
    """int64 sorted ids of the set bits of an int32 bitmask row (bit j of word w = token 32w + j);
    nz: the indices of its non-zero words when known."""
    nz = np.flatnonzero(words) if nz is None else nz
    if nz.size <= 8:  # a typical JSON state: a few words; plain ints beat ~10 numpy calls here
        ids = []
        for w, value in zip(nz.tolist(), words[nz].view(np.uint32).tolist()):
            while value:
                low = value & -value
                ids.append(32 * w + low.bit_length() - 1)
                value ^= low
        return np.array(ids, dtype=np.int64)
    bits = np.unpackbits(words[nz].astype("<i4").view(np.uint8), bitorder="little").reshape(-1, 32)
    rows, cols = np.nonzero(bits)
    return nz[rows] * 32 + _BIT_OFFSETS[cols]


def _popcount(words: np.ndarray) -> int:
    """Set bits in int32 words (np.bitwise_count needs numpy 2; pyproject allows 1.26)."""
    if hasattr(np, "bitwise_count"):
        return int(np.bitwise_count(words.view(np.uint32)).sum())
    return int(np.unpackbits(words.view(np.uint8)).sum())


class LLGuidanceMatcher(GrammarMatcher):
    """An LLMatcher plus what it does not track: EOS (llguidance keeps no history entry for it) and a
    count of accepted tokens (rollback past the start is refused before reaching llguidance)."""

    def __init__(self, inner: Any, eos_token_id: int, vocab_size: int, jump_forward: bool):
        self._m = inner
        self._eos_id = eos_token_id
        self._vocab_size = vocab_size
        self._jump = jump_forward
        self._num_accepted = 0
        self._eos = False
        self._words = np.zeros(num_words(vocab_size), dtype=np.int32)  # this step's mask, see _fill
        self._words_t = torch.from_numpy(self._words)
        self._filled_at = -1  # _version when _words was last filled (-1: never)
        self._plan: CpuMask | None = None
        self._plan_at = -1  # _version of _plan
        self._version = 0

    def _fill(self) -> np.ndarray:
        """This state's bitmask in the matcher's own row, computed once per state."""
        if self._filled_at != self._version:
            if self._eos or self._m.is_error():
                eos_only_bits(self._words_t, self._eos_id)
            else:
                self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
                if not self._words.any():  # a dead end must not reach the sampler as an all -inf row
                    eos_only_bits(self._words_t, self._eos_id)
            self._filled_at = self._version
        return self._words

    def fill_allowed_mask(self, mask: torch.Tensor) -> None:
        mask.zero_()
        ids = ids_of_words(self._fill())
        mask[torch.from_numpy(ids[ids < mask.shape[0]])] = True

    def fill_bitmask(self, words: torch.Tensor) -> None:
        own = self._words.shape[0]
        if self._filled_at != self._version and words.shape[0] == own and words.is_cpu and words.is_contiguous() \
                and not self._eos and not self._m.is_error():
            # llguidance writes the packed words straight into the batch buffer's row; the matcher keeps
            # a copy (6 KB at 49k tokens, ~1 us) so accept_token checks one bit instead of asking llguidance.
            self._m.unsafe_compute_mask_ptr(words.data_ptr(), own * 4)
            if not bool(words.any()):
                eos_only_bits(words, self._eos_id)
            self._words_t.copy_(words)
            self._filled_at = self._version
            return
        src = self._words_t if self._filled_at == self._version else torch.from_numpy(self._fill())
        n = min(own, words.shape[0])
        words[:n].copy_(src[:n])
        words[n:] = 0

    def cpu_mask(self) -> CpuMask | None:
        # The id list only when it is short: counting first keeps a 49k-wide string state at a few us
        # (extracting every id of such a state cost ~1 ms). Other states go through fill_bitmask, which
        # copies the words computed here.
        if self._plan_at == self._version:  # (MaskBuilder may ask twice in one step)
            return self._plan
        words = self._fill()
        nz = np.flatnonzero(words)
        if nz.size > MAX_LIST_IDS or _popcount(words[nz]) > MAX_LIST_IDS:
            plan = None
        else:
            plan = allowed_list(torch.from_numpy(ids_of_words(words, nz)))
        self._plan, self._plan_at = plan, self._version
        return plan

    def accept_token(self, token_id: int) -> bool:
        if self._eos or not 0 <= token_id < self._vocab_size:
            return False
        if token_id == self._eos_id:
            if not (self._m.is_accepting() and not self._m.is_error()):
                return False
            self._eos = True
        elif not self._allows(token_id) or not self._m.consume_token(token_id):
            return False
        self._num_accepted += 1
        self._version += 1
        return True

    def _allows(self, token_id: int) -> bool:
        """Checked before consuming: llguidance enters a permanent error state on a disallowed token. The
        step's mask is usually computed already (the sampler used it): then one bit decides."""
        if self._filled_at == self._version:
            return bool((int(self._words[token_id >> 5]) >> (token_id & 31)) & 1)
        return self._m.validate_tokens([token_id]) == 1

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} of {self._num_accepted} tokens")
        if not num_tokens:
            return
        rest = num_tokens
        if self._eos:
            self._eos, rest = False, rest - 1
        if rest and not self._m.rollback(rest):
            raise RuntimeError("llguidance could not roll back")
        self._num_accepted -= num_tokens
        self._version += 1

    def is_terminated(self) -> bool:
        return self._eos or self._m.is_stopped()

    def is_accepting(self) -> bool:
        return not self._m.is_error() and self._m.is_accepting()

    def jump_forward(self) -> str | None:
        if not self._jump or self._eos or self._m.is_stopped():
            return None
        # Forced bytes of a state inside a UTF-8 character start with continuation bytes: no prefix
        # of them decodes, so nothing is forced (jump-forward works on whole characters only).
        return complete_utf8_prefix(self._m.compute_ff_bytes()) or None

    def copy(self) -> "LLGuidanceMatcher":
        twin = LLGuidanceMatcher(self._m.deep_copy(), self._eos_id, self._vocab_size, self._jump)
        twin._num_accepted, twin._eos = self._num_accepted, self._eos
        return twin


class LLGuidanceGrammar(CompiledGrammar):
    def __init__(self, template: Any, eos_token_id: int, vocab_size: int, options: GrammarOptions):
        self._template = template  # an LLMatcher at the start state, never advanced
        self._eos, self._vocab_size, self._options = eos_token_id, vocab_size, options

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._template.deep_copy(), self._eos, self._vocab_size,
                                 self._options.jump_forward)


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, options: GrammarOptions | None = None):
        backend_tokenizer = getattr(tokenizer, "backend_tokenizer", None)
        if backend_tokenizer is None:
            raise ValueError("the llguidance backend needs a fast (Rust) Hugging Face tokenizer")
        self.options = options or GrammarOptions()
        self.vocab_size = vocab_size
        self.eos_token_id = int(tokenizer.eos_token_id)
        self._hf_tokenizer = tokenizer  # its token bytes, for the number layer (built on first use)
        self._number_tokens = None
        self._payload = tokenizer_payload(backend_tokenizer.to_str(), vocab_size, self.eos_token_id)
        self.tokenizer = tokenizer_from_payload(self._payload)
        digest = hashlib.sha256(self._payload).hexdigest()[:16]
        self._key = f"{self.name}:{digest}:{vocab_size}:{self.options.to_json()}"

    @property
    def cache_key(self) -> str:
        return self._key

    def compile(self, kind: str, spec: str) -> CompiledGrammar:
        return self.load(compile_serialized(kind, spec, self.options, self._payload))

    def worker_init_messages(self) -> list[bytes]:
        return [self.name.encode(), self.options.to_json().encode("utf-8"), self._payload]

    def load(self, data: bytes) -> CompiledGrammar:
        """A compiled grammar from grammar text checked by compile_serialized (here or in a worker)."""
        import llguidance as llg

        template = llg.LLMatcher(self.tokenizer, data.decode("utf-8"), log_level=0, limits=parser_limits())
        if template.is_error():  # checked in the worker already; only a different llguidance could differ
            raise GrammarError("grammar", INVALID_GRAMMAR, "grammar could not be compiled")
        # The first mask builds the lexer's start states (ms on a large schema; copies share the lexer's
        # state cache): pay it here, in the dispatcher thread, not in the first decode step.
        words = np.zeros(num_words(self.vocab_size), dtype=np.int32)
        template.deep_copy().unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        grammar = LLGuidanceGrammar(template, self.eos_token_id, self.vocab_size, self.options)
        if MARK.encode() not in data:
            return grammar
        # The lowering handed one-sided number bounds over to the number layer (number_layer.py).
        if self._number_tokens is None:
            self._number_tokens = NumberTokens.build(token_bytes_for(self._hf_tokenizer))
        return NumberBoundsGrammar(grammar, lowered_schema(data.decode("utf-8")), self._number_tokens,
                                   self.vocab_size)
