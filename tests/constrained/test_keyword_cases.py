"""No over-constraining: every hand-written valid instance of each keyword family is
accepted by the matcher, token by token, on every backend; an invalid one is never accepted where the
lowering claims exact enforcement (no approximation reported for that schema and target)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained.schema_lower import lower_schema
from tests.constrained.keyword_cases import CASES

BACKEND_NAMES = ("outlines", "xgrammar", "llguidance")
# (case, backend) pairs whose valid instances a backend cannot produce, with the reason.
KNOWN_MISSES: dict[tuple[str, str], str] = {}
# (case, backend) pairs where a backend lets an invalid instance through although the lowering is exact.
KNOWN_LEAKS: dict[tuple[str, str], str] = {}


def _texts(value, compact: bool, flexible: bool = True) -> list[str]:
    """The serializations a matcher must accept: compact JSON in compact mode, `json.dumps`' default
    spacing otherwise, and both when the whitespace is optional (outlines' default `[ ]?`)."""
    texts = []
    if compact or flexible:
        texts.append(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    if not compact:
        texts.append(json.dumps(value, ensure_ascii=False))
    return texts


@pytest.fixture(scope="module")
def all_backends(byte_tokenizer, model_vocab_size):
    out = {}
    for name in BACKEND_NAMES:
        for compact in (False, True):
            try:
                out[(name, compact)] = make_backend(name, byte_tokenizer, model_vocab_size,
                                                    GrammarOptions(compact=compact))
            except (ImportError, ValueError):
                continue
    return out


def _accepts(grammar, tokenizer, text: str) -> bool:
    matcher = grammar.matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.accept_token(token):
            return False
    return matcher.is_accepting()


def test_cases_are_labelled_right():
    for case in CASES:
        if case.name == "pattern_unicode":
            continue  # Python's `re` (jsonschema's) has no Unicode property classes
        cls = jsonschema.validators.validator_for(case.schema)
        validator = cls(case.schema, format_checker=cls.FORMAT_CHECKER)
        for value in case.valid:
            assert validator.is_valid(value), (case.name, value)
        for value in case.invalid:
            assert not validator.is_valid(value), (case.name, value)


def _run(all_backends, tokenizer, name: str):
    accepted = total = 0
    misses, leaks = [], []
    for (backend_name, compact), backend in all_backends.items():
        if backend_name != name:
            continue
        for case in CASES:
            spec = json.dumps(case.schema)
            grammar = backend.compile("json_schema", spec)
            exact = not lower_schema(spec, backend.options, name).approximations
            for value in case.valid:
                for text in _texts(value, compact, name == "outlines"):
                    total += 1
                    if _accepts(grammar, tokenizer, text):
                        accepted += 1
                    elif (case.name, name) not in KNOWN_MISSES:
                        misses.append((case.name, compact, text))
            for value in case.invalid if exact and (case.name, name) not in KNOWN_LEAKS else ():
                for text in _texts(value, compact, name == "outlines"):
                    if _accepts(grammar, tokenizer, text):
                        leaks.append((case.name, compact, text))
    return accepted, total, misses, leaks


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_valid_accepted_invalid_refused(all_backends, byte_tokenizer, name):
    if not any(b == name for b, _ in all_backends):
        pytest.skip(f"{name} backend not available")
    accepted, total, misses, leaks = _run(all_backends, byte_tokenizer, name)
    assert accepted >= 0.99 * total and not misses, (accepted, total, misses)
    assert not leaks, leaks


# oneOf / not forms the lowering writes exactly (schema_disjoint.py, the exclusive oneOf, De Morgan in
# negate()), so test_valid_accepted_invalid_refused also checks their invalid instances are refused.
EXACT_CASES = ("oneof_disjoint", "oneof_tagged", "oneof_required_xor", "oneof_refs_forbidden_key",
               "not_two_keywords", "not_required_untyped", "if_then_else")


@pytest.mark.parametrize("target", ["llguidance"])  # the default; the others drop absent keys (noted)
def test_oneof_and_not_forms_are_exact(target):
    by_name = {c.name: c for c in CASES}
    for name in EXACT_CASES:
        notes = lower_schema(json.dumps(by_name[name].schema), GrammarOptions(), target).approximations
        assert not notes, (name, notes)
