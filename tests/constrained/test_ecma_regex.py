"""ECMA-262 `pattern`s -> the libraries' regex dialects (constrained/ecma_regex.py)."""

from __future__ import annotations

import re

import pytest

from radixlm.constrained.ecma_regex import translate_pattern


@pytest.mark.parametrize("pattern", [r"\A[a-zA-Z0-9_.\-]+$", r"\A[a-zA-Z0-9_.\-]+\Z", r"^[a-zA-Z0-9_.\-]+\z"])
def test_python_anchors_are_anchors(pattern):
    """cfn-lint's AWS schemas write Python's \\A / \\Z: a document 'b0' is valid there, 'xb0!' is not."""
    for search in (False, True):
        regex, dropped = translate_pattern(pattern, json_string=False, search=search)
        assert dropped == ()
        match = re.search if search else re.fullmatch
        assert match(regex, "b0") is not None
        assert match(regex, "b0!") is None and match(regex, "!b0") is None


def test_an_escaped_backslash_before_z_stays_text():
    regex, _ = translate_pattern(r"^x\\Z$", json_string=False)
    assert re.fullmatch(regex, "x\\Z") and not re.fullmatch(regex, "x")
