"""Real-world schemas (tests/data/real_schemas/, a sample) lower for every target: no crash, and the
only refusals are the size limit (coverage and compile times: docs/json_schema.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixlm.constrained import GrammarError, GrammarOptions
from radixlm.constrained.schema_lower import TARGETS, lower_schema

CORPUS = Path(__file__).resolve().parents[1] / "data" / "real_schemas"
FILES = sorted(CORPUS.glob("*/*.json"))[::12]  # the schemas (one folder per package); a fixed sample


@pytest.mark.skipif(not FILES, reason="no corpus")
@pytest.mark.parametrize("target", TARGETS)
def test_sample_lowers(target):
    options = GrammarOptions()
    refused = []
    for path in FILES:
        spec = path.read_text(encoding="utf-8")
        try:
            lowered = lower_schema(spec, options, target)
        except GrammarError as e:
            refused.append((path.name, e.message))
            continue
        assert isinstance(lowered.schema, dict) and all(isinstance(a, str) for a in lowered.approximations)
    assert all("larger than" in message for _, message in refused), refused
