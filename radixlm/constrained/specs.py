"""Spec (kind + text; `ebnf` through ebnf_regex.py) -> regex -> serialized outlines-core Index. Pure functions of their inputs.

Runs in compile workers (cache.py) and, for tests and tools, in any process. The regex the Index is
built from is `(?:R)\\x00`: NUL marks the end of the text (see fsm.py for why).
"""

from __future__ import annotations

import json
import re

from radixlm.constrained.ascii_classes import ascii_classes
from radixlm.constrained.base import GRAMMAR_KINDS, GrammarOptions
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError
from radixlm.constrained.json_schema import schema_to_regex

_META = set("\\.+*?()|[]{}^$#&-~")


def escape_literal(text: str) -> str:
    """Escape for regex-syntax (Rust): only its metacharacters, since `\\ ` etc. are errors there."""
    return "".join("\\" + c if c in _META else c for c in text)


def regex_for_spec(kind: str, spec: str, options: GrammarOptions) -> str:
    """The regex for a spec, or GrammarError naming the request field."""
    if kind not in GRAMMAR_KINDS:
        raise GrammarError("grammar", INVALID_GRAMMAR, f"grammar kind '{kind}' is not supported by this backend")
    if not isinstance(spec, str):
        raise GrammarError(kind, INVALID_GRAMMAR, "spec must be a string")
    if kind == "regex":
        if len(spec.encode("utf-8")) > options.max_regex_bytes:
            raise GrammarError("regex", GRAMMAR_TOO_LARGE, f"regex larger than {options.max_regex_bytes} bytes")
        return ascii_classes(spec)
    if kind == "choices":
        return _choices_regex(spec, options)
    if kind == "ebnf":  # regular grammars only (recursion is refused by name)
        from radixlm.constrained.ebnf_regex import ebnf_to_regex

        return ebnf_to_regex(spec, options)
    if kind == "json_object":
        return schema_to_regex('{"type": "object"}', options)
    return schema_to_regex(spec, options)


def _choices_regex(spec: str, options: GrammarOptions) -> str:
    if len(spec.encode("utf-8")) > options.max_schema_bytes:
        raise GrammarError("choices", GRAMMAR_TOO_LARGE, f"choices larger than {options.max_schema_bytes} bytes")
    try:
        choices = json.loads(spec)
    except ValueError:
        choices = None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise GrammarError("choices", INVALID_GRAMMAR, "choices must be a non-empty JSON list of strings")
    if any("\x00" in c for c in choices):
        raise GrammarError("choices", INVALID_GRAMMAR, "choices must not contain NUL characters")
    return "(?:" + "|".join(escape_literal(c) for c in choices) + ")"


def _regex_error(param: str, regex: str, err: Exception) -> GrammarError:
    text = str(err)
    if "incompatible" in text:
        return GrammarError(param, INVALID_GRAMMAR, "regex matches no text this tokenizer can produce")
    if "too big" in text.lower() or "size limit" in text.lower():
        return GrammarError(param, GRAMMAR_TOO_LARGE, "regex compiles to an automaton that is too large")
    try:
        re.compile(regex)
    except re.error as e:  # Python's message is more precise than regex-automata's "error building NFA"
        return GrammarError(param, INVALID_GRAMMAR, f"invalid regex: {e}")
    except RecursionError:
        pass
    return GrammarError(param, INVALID_GRAMMAR,
                        "invalid or unsupported regex (lookaround and backreferences are not supported)")


_BYTE_VOCAB: list = []


def _byte_vocabulary():
    """One token per byte: enough to check a regex's syntax at DFA-building cost only."""
    from outlines_core import Vocabulary

    if not _BYTE_VOCAB:
        _BYTE_VOCAB.append(Vocabulary(256, {bytes([b]): [b] for b in range(256)}))
    return _BYTE_VOCAB[0]


def build_index_bytes(kind: str, spec: str, options: GrammarOptions, vocab_bytes: bytes) -> bytes:
    """Compile a spec into the serialized outlines-core Index (bincode, produced by outlines-core)."""
    from outlines_core import Index, Vocabulary

    regex = regex_for_spec(kind, spec, options)
    param = kind if kind in ("regex", "choices", "ebnf") else "json_schema"
    try:
        # The user regex alone first: a stray `)` must not close our `(?:...)` wrapper below.
        Index(regex, _byte_vocabulary())
    except ValueError as e:
        raise _regex_error(param, regex, e) from None
    try:
        index = Index(f"(?:{regex})\\x00", Vocabulary.from_binary(vocab_bytes))
    except ValueError as e:
        raise _regex_error(param, regex, e) from None
    _, (data,) = index.__reduce__()  # (Index.from_binary, (bincode bytes,))
    return data
