"""No request runs unbounded work where others wait: finished-output checks run in killable workers under a
deadline (a backtracking `pattern`, a 1 MB schema's validator), schemas in tools / structural_tag are lowered
by the compile worker (not where the request is built), an abandoned compile stops, and grammars llguidance
cannot run are refused when they compile (not aborted after the first token)."""

from __future__ import annotations

import json
import time

import pytest

from radixlm.constrained import GrammarError, GrammarOptions, make_backend
from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig
from radixlm.constrained.check_pool import OutputChecker
from radixlm.constrained.simulate import random_walk

pytest.importorskip("llguidance")

# Widened in the grammar (look-around), so the model may write "aaa...": regress then backtracks through
# 2^n paths (hours at n = 40) before it answers "no match".
HOSTILE = json.dumps({"type": "string", "pattern": "^(a|a)*(?<!a)$", "minLength": 40, "maxLength": 40})
HOSTILE_TEXT = json.dumps("a" * 40)


def exponential_schema(n: int = 16) -> dict:
    """An allOf of n two-branch anyOfs: lowering it explores 2^n branches (minutes at n = 16, 1.5 KB)."""
    return {"type": "object", "allOf": [{"anyOf": [{"properties": {f"p{i}": {"type": "integer"}}},
                                                   {"properties": {f"q{i}": {"type": "string"}}}]}
                                        for i in range(n)]}


def big_schema() -> str:
    """~1 MB: a boolean schema plus 1,800 unused definitions; jsonschema takes seconds to build its validator."""
    defs = {f"d{i}": {"type": "object", "properties": {f"k{j}": {"type": "string", "maxLength": j} for j in range(12)}}
            for i in range(1800)}
    return json.dumps({"title": str(time.time_ns()), "definitions": defs, "type": "boolean"})


@pytest.fixture(scope="module")
def llg(byte_tokenizer, model_vocab_size):
    return make_backend("llguidance", byte_tokenizer, model_vocab_size, GrammarOptions())


@pytest.mark.timeout(120)
def test_a_check_past_its_deadline_is_unchecked_and_the_worker_serves_on():
    checker = OutputChecker(num_workers=1, timeout_s=1.0)
    try:
        stuck = checker.check(HOSTILE, HOSTILE_TEXT, True)
        assert stuck.valid is None and stuck.error.startswith("unchecked:")
        assert checker.check(HOSTILE, json.dumps("b" * 40), True).valid is False  # a fresh worker, same schema
        assert checker.check('{"type": "string"}', '"x"', True).valid is True
        assert checker.check(HOSTILE, '"aa', False).error.startswith("incomplete")  # no worker needed
    finally:
        checker.close()


def test_abandoned_compile_stops_its_worker(llg):
    from radixlm.tools.grammar import tool_grammar
    from radixlm.tools.parsers import hermes
    from radixlm.tools.spec import parse_tool_request

    req = parse_tool_request({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": exponential_schema()}}], "tool_choice": "required"})
    grammar = tool_grammar(req, hermes.FORMAT, GrammarOptions())  # text only: lowering is the worker's
    with GrammarCache(llg, GrammarCacheConfig(num_workers=1, compile_timeout_s=600)) as cache:
        fut = cache.submit("ebnf", grammar)
        while not fut.running():
            time.sleep(0.01)
        pid = cache.worker_pids()[0]
        cache.abandon(fut)
        with pytest.raises(GrammarError):
            fut.result(timeout=60)  # far sooner than the compile (minutes) or its deadline (600 s)
        assert cache.worker_pids()[0] != pid
        again = cache.submit("ebnf", grammar)
        assert again is not fut  # not cached: a later request compiles it again
        cache.abandon(again)  # (queued or running: either way it stops)
        assert cache.submit("regex", "[ab]+").result(timeout=120).matcher() is not None


def test_schema_lowering_of_tools_and_structural_tags_is_the_workers(llg):
    """Building the request is text work; the compile worker lowers under its deadline and names the field."""
    from radixlm.sampling_params import SamplingParams
    from radixlm.tools.grammar import tool_grammar
    from radixlm.tools.parsers import hermes
    from radixlm.tools.spec import parse_tool_request

    tools = parse_tool_request({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": exponential_schema()}}], "tool_choice": "required"})
    tag = {"type": "structural_tag", "triggers": ["<f>"],
           "structures": [{"begin": "<f>", "schema": exponential_schema(), "end": "</f>"}]}
    specs = {"tools": tool_grammar(tools, hermes.FORMAT, GrammarOptions()),
             "structural_tag": SamplingParams.from_dict({"structural_tag": tag}).ebnf}
    with GrammarCache(llg, GrammarCacheConfig(num_workers=2, compile_timeout_s=2.0)) as cache:
        futures = {param: cache.submit("ebnf", spec) for param, spec in specs.items()}
        for param, fut in futures.items():
            with pytest.raises(GrammarError) as info:
                fut.result(timeout=120)
            assert (info.value.param, info.value.code) == (param, "grammar_timeout")


@pytest.mark.timeout(120)
def test_detokenizer_never_waits_for_a_check(tiny_llama_dir):
    """Item by item: a backtracking pattern and a 1 MB schema's validator are checked in workers; the other
    request's output goes out at once and the hostile one comes later, unchecked at the deadline."""
    from transformers import AutoTokenizer

    from radixlm.runtime.detokenizer import CheckerConfig, Detokenizer
    from radixlm.runtime.generate_input import InputLimits, prepare_generate
    from radixlm.runtime.messages import BatchTokenOut, FinishReason, GenerateReq, TokenOut

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))

    def register(rid: str, params: dict) -> None:
        (p,), _ = prepare_generate(tokenizer, InputLimits(len(tokenizer), 512, 4096), text="x", rid=rid,
                                   sampling_params={"max_new_tokens": 64, **params})
        detok.handle(GenerateReq(p.msg, [rid], True))

    def finish(rid: str, text: str):
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return detok.handle(BatchTokenOut([TokenOut(rid, ids, 1, len(ids), 0, FinishReason("stop"))]))

    detok = Detokenizer(tokenizer, CheckerConfig(num_workers=2, timeout_s=1.0))
    try:
        register("hostile", {"json_schema": HOSTILE})
        register("big", {"json_schema": big_schema()})
        register("plain", {})
        assert finish("hostile", HOSTILE_TEXT) is None and finish("big", "true") is None  # checks pending
        plain = finish("plain", "hello")
        assert [o.rid for o in plain.outputs] == ["plain"] and plain.outputs[0].finished
        finals = {}
        while len(finals) < 2:
            checked = detok.checked_outputs()
            finals.update({o.rid: o.payload["meta_info"] for o in checked.outputs} if checked else {})
            time.sleep(0.05)
        for meta in finals.values():
            assert meta["json_schema_valid"] is None and meta["json_schema_error"].startswith("unchecked")
        assert detok.checking == [] and detok.states == {}
    finally:
        detok.close()


def _walk_text(llg, byte_tokenizer, model_vocab_size, kind: str, spec: str) -> str:
    res = random_walk(llg.compile(kind, spec).matcher(), byte_tokenizer, model_vocab_size, seed=3, max_tokens=64)
    assert res.finished
    return res.text


def test_thousands_of_choices_work(llg, byte_tokenizer, model_vocab_size):
    labels = [f"label {i}" for i in range(20000)]
    assert _walk_text(llg, byte_tokenizer, model_vocab_size, "choices", json.dumps(labels)) in labels
    prefixes = ["a", "ab", "abc", ""]
    assert _walk_text(llg, byte_tokenizer, model_vocab_size, "choices", json.dumps(prefixes)) in prefixes


@pytest.mark.parametrize("kind, spec, param, code, says", [
    ("ebnf", "root ::= " + " | ".join(f'"w{i}"' for i in range(20000)), "ebnf", "grammar_too_large", "one terminal"),
    ("ebnf", "root ::= root", "ebnf", "invalid_grammar", "accepts no string"),
    ("ebnf", "start: a\na: b\nb: a", "ebnf", "invalid_grammar", "accepts no string"),
    ("json_schema", json.dumps({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                "$ref": "#/$defs/a"}), "json_schema", "invalid_grammar", "accepts no string"),
])
def test_grammars_llguidance_cannot_run_are_refused_at_compile(llg, kind, spec, param, code, says):
    with pytest.raises(GrammarError) as info:
        llg.compile(kind, spec)
    assert (info.value.param, info.value.code) == (param, code) and says in info.value.message


def test_the_probe_leaves_runnable_grammars_alone(llg, byte_tokenizer, model_vocab_size):
    assert _walk_text(llg, byte_tokenizer, model_vocab_size, "ebnf", 'root ::= ""') == ""
    assert _walk_text(llg, byte_tokenizer, model_vocab_size, "ebnf", 'root ::= "ab" root | "c"').endswith("c")
    assert isinstance(json.loads(_walk_text(llg, byte_tokenizer, model_vocab_size, "json_schema",
                                            '{"type": "integer"}')), int)
