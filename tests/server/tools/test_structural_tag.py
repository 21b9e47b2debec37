"""SGLang's structural_tag (the native /generate constraint): SamplingParams lowers it to llguidance Lark;
walks through it always give valid JSON after every trigger."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.constrained.simulate import random_walk
from radixlm.errors import InvalidRequestError
from radixlm.tools.parsers.base import decode_at
from radixlm.sampling_params import SamplingParams
from tests.server.tools.conftest import SCHEMAS

TAG = {"type": "structural_tag", "triggers": ["<function="],
       "structures": [{"begin": "<function=get_weather>", "schema": SCHEMAS["get_weather"], "end": "</function>"},
                      {"begin": "<function=calculator>", "schema": SCHEMAS["calculator"], "end": "</function>"}]}


def test_sampling_params_lower_it_once():
    params = SamplingParams.from_dict({"structural_tag": json.dumps(TAG)})
    assert params.structural_tag is None and "%json" in params.ebnf and "lazy" in params.ebnf
    again = SamplingParams.from_dict(params.to_dict())  # crossing a process keeps the grammar
    assert again.ebnf == params.ebnf
    assert SamplingParams.from_dict({"structural_tag": TAG}).ebnf == params.ebnf


@pytest.mark.parametrize("bad", ["not json", {"type": "other"}, {"structures": [], "triggers": ["x"]},
                                 {"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<b"]},
                                 {"structures": [{"begin": 1, "end": ""}], "triggers": ["x"]}])
def test_bad_structural_tags_are_400(bad):
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams.from_dict({"structural_tag": bad})
    assert exc.value.param == "structural_tag"
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_dict({"structural_tag": TAG, "ebnf": "start: \"a\""})


def test_walks_follow_the_structures(llg_backend, byte_tokenizer):
    grammar = llg_backend.compile("ebnf", SamplingParams.from_dict({"structural_tag": TAG}).ebnf)
    for seed in range(6):
        matcher = grammar.matcher()
        prefix = "Sure: <function=" if seed % 2 else "plain text, then <function="
        for tid in byte_tokenizer(prefix, add_special_tokens=False).input_ids:
            assert matcher.accept_token(tid)
        res = random_walk(matcher, byte_tokenizer, llg_backend.vocab_size, seed=seed, max_tokens=600)
        text = prefix + res.text
        start = text.index("<function=")
        name = text[start + len("<function="):].split(">", 1)[0]
        value, end = decode_at(text, start + len(f"<function={name}>"))
        jsonschema.validate(value, SCHEMAS[name])
        assert text[end:].startswith("</function>")
