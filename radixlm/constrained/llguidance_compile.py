"""Spec (kind + text) -> a validated llguidance grammar (llguidance's own JSON grammar text).

Runs in compile workers (cache.py) and, for tests and tools, in any process. Imports neither torch nor
the HF tokenizer stack: the worker gets the tokenizer as its JSON text and builds an LLTokenizer once.
What crosses back to the scheduler is the grammar text the worker compiled and checked, never a
client's bytes; the scheduler builds matchers from it (llguidance_backend.py).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.ascii_classes import ascii_classes
from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.ebnf import ebnf_to_lark
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError

# Words in llguidance's messages that mean a resource limit was hit (the grammar is too big, not wrong).
_TOO_LARGE_WORDS = ("too large", "too big", "too many", "too complex", "limit", "fuel", "exceeded", "max is")
_PROBE_TOKENS = 8  # tokens walked at compile time (check_grammar)
_WORKER_STATE: dict[str, Any] = {}


def parser_limits() -> Any:
    import llguidance as llg

    # verbose_errors=False: messages must not echo parser state or the grammar back to the client.
    return llg.LLParserLimits(verbose_errors=False)


def json_options(options: GrammarOptions) -> dict[str, Any]:
    """llguidance's JSON compile options for our whitespace options: compact -> no whitespace; otherwise
    the pattern between every JSON token, `[ ]?` like outlines-core when none is set."""
    opts: dict[str, Any] = {"lenient": True}  # keywords llguidance does not implement are ignored;
    if options.compact:  # radixlm validates finished outputs against the original schema
        opts.update(whitespace_flexible=False, item_separator=",", key_separator=":")
    else:
        opts.update(whitespace_flexible=True, whitespace_pattern=options.whitespace_pattern or "[ ]?",
                    item_separator=",", key_separator=":")
    return opts


def external_ref(node: Any) -> str | None:
    """The first $ref that does not point into the document itself (nothing is ever fetched). Only a
    string is a reference: `"$ref": {...}` is a property named $ref (its value a schema)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            ref = cur.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                return ref
            stack.extend(cur.values())
        elif isinstance(cur, list):
            stack.extend(cur)
    return None


def grammar_text(kind: str, spec: str, options: GrammarOptions) -> str:
    """llguidance grammar text for a spec (not yet checked against a tokenizer), or GrammarError."""
    import llguidance as llg

    if not isinstance(spec, str):
        raise GrammarError(kind, INVALID_GRAMMAR, "spec must be a string")
    if kind == "regex":
        if len(spec.encode("utf-8")) > options.max_regex_bytes:
            raise GrammarError("regex", GRAMMAR_TOO_LARGE, f"regex larger than {options.max_regex_bytes} bytes")
        return llg.LLMatcher.grammar_from_regex(ascii_classes(spec))
    if kind == "choices":
        from radixlm.constrained.specs import regex_for_spec

        regex_for_spec("choices", spec, options)  # the same checks as the other backends
        # One terminal: its literals become one lexer automaton (a trie), so thousands of labels cost what a
        # few do; as rule alternatives, each would be an Earley item, and past the parser's row limit (2000)
        # the first token fails. Lark string literals take JSON-style escapes: each choice stays a literal.
        return llg.LLMatcher.grammar_from_lark("start: CHOICE\nCHOICE: " + " | ".join(
            json.dumps(c) for c in json.loads(spec)))
    if kind == "ebnf":  # deferred %json bodies (tools, structural_tag) are lowered here, under the deadline
        from radixlm.constrained.deferred_json import expand

        return llg.LLMatcher.grammar_from_lark(expand(ebnf_to_lark(spec, options), options))
    if kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', overrides=json_options(options))
    if kind == "json_schema":
        from radixlm.constrained.schema_lower import lower_schema

        from radixlm.constrained.number_bounds import hand_over

        # The "llguidance" lowering keeps local $refs (recursion included) for llguidance to compile;
        # lenient, llguidance ignores what it still lacks (finished outputs are validated separately).
        # One-sided number bounds go to the number layer (number_layer.py), which takes exponents.
        schema = hand_over(lower_schema(spec, options, "llguidance").schema)
        ref = external_ref(schema)
        if ref is not None:
            raise GrammarError("json_schema", INVALID_GRAMMAR, f"external $ref '{ref}' is not supported")
        try:
            return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=json_options(options))
        except ValueError as e:
            raise GrammarError("json_schema", INVALID_GRAMMAR, _message(str(e))) from None
    param = kind if kind == "json_schema" else "grammar"
    raise GrammarError(param, INVALID_GRAMMAR, f"grammar kind '{kind}' is not supported")


def _message(text: str) -> str:
    """One line from an llguidance error: its first line without the `at 1(8):` position prefix, plus
    the regex parser's `error: ...` line when there is one (the source excerpt lines are left out)."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    line = lines[0] if lines else ""
    if line.startswith("at ") and ": " in line:
        line = line.split(": ", 1)[1]
    detail = next((ln for ln in lines[1:] if ln.startswith("error: ")), None)
    if detail:
        line = f"{line.rstrip(':')}: {detail[len('error: '):]}"
    return (line or "grammar could not be compiled")[:240]


def grammar_error(param: str, text: str) -> GrammarError:
    message = _message(text)
    code = GRAMMAR_TOO_LARGE if any(w in message.lower() for w in _TOO_LARGE_WORDS) else INVALID_GRAMMAR
    return GrammarError(param, code, message)


def param_of(kind: str) -> str:
    return {"json_object": "response_format"}.get(kind, kind)


def check_grammar(grammar: str, tokenizer: Any, param: str) -> None:
    """Build a matcher (grammar + lexer checks against the tokenizer) and probe its first tokens; GrammarError
    if llguidance refuses."""
    import llguidance as llg

    matcher = llg.LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits())
    if matcher.is_error():
        raise grammar_error(param, matcher.get_error())
    _probe(matcher, tokenizer, param)


def _probe(matcher: Any, tokenizer: Any, param: str) -> None:
    """Walk a few tokens (the lowest allowed id each time, never EOS). A grammar llguidance cannot run fails
    here rather than after the request's first sampled token: one that accepts no string (`root ::= root`,
    a $ref cycle) has no allowed token at all; one wider than the parser's row limit (a rule with thousands
    of alternatives) fails on its first token. Failures deeper in a grammar are not found (docs/robustness.md)."""
    import numpy as np

    words = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
    for _ in range(_PROBE_TOKENS):
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if matcher.is_error():
            break
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        allowed = allowed[allowed != tokenizer.eos_token]
        if not allowed.size:  # only EOS: the walk is done
            return
        if not matcher.consume_token(int(allowed[0])):
            break
    else:
        return
    if not matcher.is_error():
        return
    text = matcher.get_error()
    if text.startswith("NoExtension"):
        raise GrammarError(param, INVALID_GRAMMAR, "the grammar accepts no string (a rule defined only by "
                                                   "itself, a $ref cycle, ...)")
    error = grammar_error(param, text)
    if "row has" in text:  # the parser's row limit: say how to write such a grammar
        raise GrammarError(param, error.code, error.message + " (a rule with thousands of alternatives: write "
                                                              'its literals as one terminal, `WORD: "a" | "b" | ...`)')
    raise error


def tokenizer_payload(tokenizer_json: str, n_vocab: int, eos_token_id: int) -> bytes:
    """What a compile worker needs to rebuild the LLTokenizer (the HF tokenizer's own JSON)."""
    return json.dumps({"tokenizer": tokenizer_json, "n_vocab": n_vocab, "eos": eos_token_id}).encode("utf-8")


def tokenizer_from_payload(payload: bytes) -> Any:
    import llguidance as llg

    d = json.loads(payload)
    return llg.LLTokenizer(d["tokenizer"], n_vocab=int(d["n_vocab"]), eos_token=int(d["eos"]))


def compile_serialized(kind: str, spec: str, options: GrammarOptions, payload: bytes) -> bytes:
    """Worker entry point: the checked grammar text (UTF-8) for a spec, or GrammarError."""
    if _WORKER_STATE.get("payload") != payload:
        _WORKER_STATE.update(payload=payload, tokenizer=tokenizer_from_payload(payload))
    grammar = grammar_text(kind, spec, options)
    check_grammar(grammar, _WORKER_STATE["tokenizer"], param_of(kind))
    return grammar.encode("utf-8")
