"""A `regex` constraint's `\\d \\w \\s \\D \\W \\S` mean their ASCII classes (Python's `re.ASCII`, SGLang's other
backends) on every grammar backend: the rewrite agrees with `re.ASCII` on any string, and walks through
each backend's grammar produce only strings that `re.fullmatch(pattern, s, re.ASCII)` accepts."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained.ascii_classes import ascii_classes
from radixlm.constrained.simulate import random_walk

PATTERNS = [r"\d{3}-\d\d", r"\w+", r"\s\S\d", r"[\d.]+", r"[^\s]{2,4}", r"[\w.-]+@[a-z]+", r"[\D]{2}",
            r"[^\D]+", r"[\Dx]", r"[^\Wa]+", r"\\d\d", r"[\d\s]+", r"\W\D\S", r"[]\d]+", r"[\w-]+",
            r"[^\d\D]", r"[\d\D]", r"(\d|x)\.\w*", r"[a-c\S]+"]
# ASCII and the non-ASCII digits, letters and spaces that Unicode classes admit.
ALPHABET = "09az_AZ -.@x\\\t\n\x0b]" + "٣🯸١é\u00a0\u2028ǅ²"


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PATTERNS), st.text(alphabet=ALPHABET, max_size=6))
def test_rewrite_agrees_with_re_ascii(pattern, text):
    assert bool(re.fullmatch(ascii_classes(pattern), text)) == bool(re.fullmatch(pattern, text, re.ASCII))


def test_rewrite_respects_the_pattern_structure():
    assert ascii_classes(r"\\d") == r"\\d"  # an escaped backslash, then a literal d
    assert ascii_classes(r"\d") == "[0-9]" and ascii_classes(r"\D") == "[^0-9]"
    assert ascii_classes(r"[\d.]") == "[0-9.]" and ascii_classes(r"[^\D]") == "[0-9]"
    assert ascii_classes(r"a[b]c\.\p{L}") == r"a[b]c\.\p{L}"  # nothing to rewrite: unchanged
    assert ascii_classes(r"[[:alpha:]]\d") == "[[:alpha:]][0-9]"  # a class without escapes is copied as written
    assert ascii_classes("[\\d") == "[\\d"  # unterminated: left for the backend's error


def _backends(tokenizer, vocab_size):
    names = ["llguidance", "outlines"]
    try:
        import xgrammar  # noqa: F401

        names.append("xgrammar")
    except ImportError:
        pass
    return {name: make_backend(name, tokenizer, vocab_size, GrammarOptions()) for name in names}


WALKED = [r"\d{3}-\d{2}", r"\w{2,6}", r"\s\S\D\W", r"[\d\s]{3}", r"[^\Wa]{2,4}", r"[\D]{3}"]


@pytest.mark.parametrize("name", ["llguidance", "outlines", "xgrammar"])
def test_backends_generate_ascii_classes(name, byte_tokenizer, model_vocab_size):
    backends = _backends(byte_tokenizer, model_vocab_size)
    if name not in backends:
        pytest.skip(f"the {name} backend is not installed")
    for pattern in WALKED:
        grammar = backends[name].compile("regex", pattern)
        for seed in range(12):
            walk = random_walk(grammar.matcher(), byte_tokenizer, model_vocab_size, seed=seed, jump_forward=False)
            assert walk.finished and re.fullmatch(pattern, walk.text, re.ASCII), (pattern, walk.text)
