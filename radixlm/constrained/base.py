"""The grammar-backend plug point: options, backend, compiled grammar and per-request matcher.

Runs in the scheduler process (matchers are driven by the scheduler loop) and in compile workers
(backends compile specs there). A backend turns a spec (regex / json_schema / choices / json_object)
(and ebnf: GBNF or Lark text, see ebnf.py)
into a CompiledGrammar; each request gets its own GrammarMatcher from it.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is only needed by matchers; workers never import it
    import torch

    from radixlm.constrained.bitmask import CpuMask

GRAMMAR_KINDS = ("regex", "json_schema", "choices", "json_object", "ebnf")


@dataclass(frozen=True)
class GrammarOptions:
    """Everything that changes what a spec compiles to (so it is part of the cache key)."""

    # Regex for optional whitespace between JSON tokens; None keeps outlines-core's default `[ ]?`.
    whitespace_pattern: str | None = None
    # Compact JSON: no whitespace at all between tokens (fewer tokens, more forced text to jump over).
    compact: bool = False
    # Matchers report forced strings from jump_forward(); False makes jump_forward() always None.
    jump_forward: bool = True
    # Limits from ../shared/design/robustness.md.
    max_regex_bytes: int = 4 * 1024
    max_schema_bytes: int = 1 << 20  # = sampling_params.MAX_JSON_SCHEMA_BYTES
    max_schema_depth: int = 32

    @property
    def effective_whitespace(self) -> str | None:
        return "" if self.compact else self.whitespace_pattern

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "GrammarOptions":
        return cls(**json.loads(text))


class GrammarMatcher(ABC):
    """One request's cursor in a compiled grammar. Not thread-safe; owned by the scheduler."""

    @abstractmethod
    def fill_allowed_mask(self, mask: "torch.Tensor") -> None:
        """Write the allowed tokens into mask (bool [V_model], True = allowed), overwriting every entry.
        Ids the tokenizer does not have (model padding) are never allowed; EOS only in accepting states."""

    def fill_bitmask(self, words: "torch.Tensor") -> None:
        """The same mask packed (what the scheduler uses per step): words int32 [n] (a row of the batch
        buffer, any device), bit j of word w set <=> token 32w + j allowed; every word is overwritten.
        Backends override this with a copy of a cached packed row; this fallback packs the bool mask."""
        import torch

        from radixlm.constrained.bitmask import pack_bool

        mask = torch.zeros(words.shape[0] * 32, dtype=torch.bool)
        self.fill_allowed_mask(mask)
        words.copy_(pack_bool(mask))

    def cpu_mask(self) -> "CpuMask | None":
        """The same mask in a CPU layout (an allowed-id list or an additive row, see bitmask.py), cached
        by the backend, or None if it has none; then the scheduler uses fill_bitmask."""
        return None

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance over token_id; False (state unchanged) if the grammar does not allow it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens (EOS included)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """EOS was accepted, or no token can follow (the output is complete)."""

    @abstractmethod
    def is_accepting(self) -> bool:
        """The text so far is a complete match (EOS allowed now)."""

    @abstractmethod
    def jump_forward(self) -> str | None:
        """The string every valid continuation starts with (compressed-FSM singular path), or None."""

    @abstractmethod
    def copy(self) -> "GrammarMatcher":
        """An independent matcher in the same state (for n > 1 / forks)."""


class CompiledGrammar(ABC):
    """A compiled spec; immutable and shared by every request with the same spec."""

    @abstractmethod
    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start state."""


class GrammarBackend(ABC):
    """Compiles specs for one tokenizer and model vocabulary size."""

    name: str

    @abstractmethod
    def compile(self, kind: str, spec: str) -> CompiledGrammar:
        """Compile in this process (blocking; the GrammarCache runs it off the scheduler loop).
        Raises GrammarError for a bad or unsupported spec."""

    @property
    @abstractmethod
    def cache_key(self) -> str:
        """Identifies tokenizer + vocab size + options: compiled grammars are reusable iff keys match."""
