"""Tool test fixtures: the weather / calculator tool set and an llguidance backend over the tiny byte
tokenizer (built locally, nothing downloaded)."""

from __future__ import annotations

import pytest

from radixlm.constrained import GrammarOptions, make_backend

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Compute a op b",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "number", "minimum": -1e6, "maximum": 1e6}, "b": {"type": "number", "minimum": -1e6,
                                                                        "maximum": 1e6},
        "op": {"type": "string", "enum": ["+", "-", "*", "/"]}},
        "required": ["a", "b", "op"], "additionalProperties": False}}}
TOOLS = [WEATHER, CALCULATOR]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="session")
def byte_tokenizer(tmp_path_factory):
    from radixlm.testing import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def llg_backend(byte_tokenizer):
    return make_backend("llguidance", byte_tokenizer, len(byte_tokenizer) + 16, GrammarOptions())
