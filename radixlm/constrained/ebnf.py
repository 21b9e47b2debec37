"""The `ebnf` grammar kind: GBNF (llama.cpp / xgrammar, `root ::= ...`) or Lark (`start: ...`) text.

Runs in compile workers (and in any process for tests). Which syntax a grammar is in is told by its
rule definitions: GBNF defines rules with `::=`, Lark with `:`. llguidance and xgrammar compile both
(llguidance after its own GBNF -> Lark converter, xgrammar natively); the outlines backend turns a
grammar without recursion into a regex (ebnf_regex.py).
"""

from __future__ import annotations

import re

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError

PARAM = "ebnf"
_GBNF_RULE = re.compile(r"(?m)^\s*[A-Za-z_][A-Za-z0-9_-]*\s*::=")
_LARK_RULE = re.compile(r"(?m)^\s*[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?\d+)?\s*:")


def check_size(spec: str, options: GrammarOptions) -> None:
    if not isinstance(spec, str) or not spec.strip():
        raise GrammarError(PARAM, INVALID_GRAMMAR, "grammar must be a non-empty string")
    if len(spec.encode("utf-8")) > options.max_schema_bytes:
        raise GrammarError(PARAM, GRAMMAR_TOO_LARGE, f"grammar larger than {options.max_schema_bytes} bytes")


def syntax_of(spec: str) -> str:
    """"gbnf" or "lark" (or GrammarError when the text defines no rule in either syntax)."""
    if _GBNF_RULE.search(spec):
        return "gbnf"
    if _LARK_RULE.search(spec) or spec.lstrip().startswith("%llguidance"):
        return "lark"
    raise GrammarError(PARAM, INVALID_GRAMMAR,
                       "grammar defines no rule: expected GBNF (`root ::= ...`) or Lark (`start: ...`)")


def gbnf_to_lark(spec: str) -> str:
    """GBNF -> Lark with llguidance's converter (`root` becomes `start`)."""
    from llguidance.gbnf_to_lark import gbnf_to_lark as convert

    try:
        return convert(spec)
    except Exception as e:  # noqa: BLE001 - the converter raises its own error types and asserts
        message = str(e).splitlines()[0] if str(e) else "invalid GBNF grammar"
        raise GrammarError(PARAM, INVALID_GRAMMAR, f"invalid GBNF grammar: {message}"[:240]) from None


def ebnf_to_lark(spec: str, options: GrammarOptions) -> str:
    """The grammar as Lark text (llguidance's dialect), after the size check."""
    check_size(spec, options)
    return gbnf_to_lark(spec) if syntax_of(spec) == "gbnf" else spec
