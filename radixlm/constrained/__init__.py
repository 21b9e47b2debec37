"""radixlm.constrained: regex / JSON schema / choices / EBNF -> token FSM, jump-forward, grammar cache.

Importing this package never imports torch (compile workers import it too); backends load lazily.
"""

from __future__ import annotations

from typing import Any

from radixlm.constrained.base import (GRAMMAR_KINDS, CompiledGrammar, GrammarBackend, GrammarMatcher,
                                      GrammarOptions)
from radixlm.constrained.errors import (GRAMMAR_TIMEOUT, GRAMMAR_TOO_LARGE, INVALID_GRAMMAR,
                                        GrammarError)

BACKENDS = ("outlines", "xgrammar", "llguidance")


def make_backend(name: str, tokenizer: Any, vocab_size: int, options: GrammarOptions | None = None) -> GrammarBackend:
    """The grammar backend `name` for a tokenizer and the model's vocabulary size (V_model)."""
    if name == "outlines":
        from radixlm.constrained.outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, vocab_size, options or GrammarOptions())
    if name == "xgrammar":  # optional dependency: ImportError if xgrammar is not installed
        from radixlm.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, options or GrammarOptions())
    if name == "llguidance":
        from radixlm.constrained.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(tokenizer, vocab_size, options or GrammarOptions())
    raise ValueError(f"unknown grammar backend {name!r}; available: {BACKENDS}")


def __getattr__(name: str) -> Any:
    if name == "GrammarCache":
        from radixlm.constrained.cache import GrammarCache

        return GrammarCache
    if name == "jump_forward_tokens":
        from radixlm.constrained.jump_forward import jump_forward_tokens

        return jump_forward_tokens
    raise AttributeError(name)


__all__ = ["GRAMMAR_KINDS", "CompiledGrammar", "GrammarBackend", "GrammarMatcher", "GrammarOptions",
           "GrammarError", "INVALID_GRAMMAR", "GRAMMAR_TOO_LARGE", "GRAMMAR_TIMEOUT", "make_backend",
           "GrammarCache", "jump_forward_tokens", "BACKENDS"]
