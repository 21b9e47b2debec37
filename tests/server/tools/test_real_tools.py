"""Real tool definitions (tests/data/real_tools/: every function of the Berkeley Function Calling Leaderboard,
3,400 of them in 3,600 tool sets) sent as BFCL sends them to an OpenAI-compatible server, planned and
compiled as the server does (llguidance, the real SmolLM2 tokenizer and its tool-call format): every set is
taken unless one of its functions admits no arguments at all, and then the 400 names that function; every
right answer BFCL publishes is accepted by the grammar token by token and comes back from the parser as
the same calls; the same answer missing a required argument, or with an undeclared one, is not."""

from __future__ import annotations

import json

import jsonschema
import pytest

from benchmarks.schema_order import serialize
from benchmarks.tool_corpus import answer_calls, load_tool_sets, source, unsatisfiable_property
from radixlm.constrained import GrammarOptions, make_backend
from radixlm.constrained.errors import GrammarError
from radixlm.errors import InvalidRequestError
from radixlm.tools.plan import GRAMMAR_BACKEND, plan_tools
from radixlm.tools.prompt import format_call

MIN_SETS = 3600
MIN_ANSWERS = 2400        # ground-truth answers that validate against their (converted) schemas
AUTO_EVERY = 8            # tool_choice auto (a lazy trigger after free text) on an evenly spaced sample
REFUSED = (InvalidRequestError, GrammarError)  # a bad tool field, or a schema refused when the grammar compiles


@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.runtime.model.loader import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="module")
def backend(tokenizer):
    return make_backend(GRAMMAR_BACKEND, tokenizer, len(tokenizer), GrammarOptions())


@pytest.fixture(scope="module")
def tool_sets():
    return load_tool_sets()


@pytest.fixture(scope="module")
def compiled(tool_sets, tokenizer, backend):
    """Per tool set, tool_choice required: (plan, compiled grammar) or the 400 (a bad schema is found when the
    grammar compiles: the compile worker lowers the tools' schemas)."""
    out = []
    for ts in tool_sets:
        try:
            plan = plan_tools({"tools": list(ts.tools), "tool_choice": "required"}, tokenizer, "auto",
                              GRAMMAR_BACKEND, GrammarOptions())
            out.append((plan, backend.compile("ebnf", plan.grammar)))
        except REFUSED as e:
            out.append(e)
    return out


def _unsatisfiable(ts) -> list[str]:
    return [t["function"]["name"] for t in ts.tools if unsatisfiable_property(t["function"]["parameters"])]


def _matches(grammar, tokenizer, text: str) -> bool:
    matcher = grammar.matcher()
    return all(matcher.accept_token(i) for i in tokenizer.encode(text, add_special_tokens=False)) \
        and matcher.is_accepting()


def _call_text(plan, ts, calls) -> str:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in ts.tools}
    fmt = plan.fmt
    return fmt.open + fmt.sep.join(format_call(fmt, name, json.loads(serialize(args, schemas[name])))
                                   for name, args in calls) + fmt.close


def _listed_only(schema):
    """The schema as tool grammars read it: an object listing `properties` (and no other key rule) takes
    only those (BFCL's schemas use no combinators, so a walk over properties and items covers them)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _listed_only(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and "patternProperties" not in out:
            out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = _listed_only(out["items"])
    return out


def _valid_answer(ts) -> list | None:
    """BFCL's answer when it is a valid call: valid against the schema, with no undeclared argument (3 of
    BFCL's answers name one, e.g. `journey_start_time` for a function without it)."""
    calls = answer_calls(ts)
    if calls is None:
        return None
    schemas = {t["function"]["name"]: _listed_only(t["function"]["parameters"]) for t in ts.tools}
    ok = all(jsonschema.Draft202012Validator(schemas[n]).is_valid(a) for n, a in calls)
    return calls if ok else None


def test_corpus_is_bfcls(tool_sets):
    assert source()["package"] == "bfcl-eval" and source()["license"] == "Apache-2.0"
    assert len(tool_sets) >= MIN_SETS
    assert {ts.file.split("/")[0] for ts in tool_sets} >= {"BFCL_v4_simple_python.json", "BFCL_v4_live_multiple.json",
                                                         "BFCL_v4_parallel_multiple.json", "multi_turn_func_doc"}


def test_every_tool_set_is_taken_unless_a_function_admits_no_arguments(tool_sets, compiled):
    refused = []
    for ts, got in zip(tool_sets, compiled):
        bad = _unsatisfiable(ts)
        if not bad:
            assert not isinstance(got, REFUSED), (ts.id, str(got))
            continue
        assert isinstance(got, REFUSED), ts.id
        assert got.param == "tools" and "admits no value" in str(got) and bad[0] in str(got), str(got)
        refused.append(ts.id)
    assert len(refused) <= 0.001 * len(tool_sets), refused


def test_every_right_answer_matches_the_grammar_and_parses_back(tool_sets, compiled, tokenizer):
    checked = 0
    for ts, got in zip(tool_sets, compiled):
        calls = _valid_answer(ts) if not isinstance(got, REFUSED) else None
        if calls is None:
            continue
        plan, grammar = got
        text = _call_text(plan, ts, calls)
        assert _matches(grammar, tokenizer, text), (ts.id, text[:300])
        parsed = plan.accepted_calls(text)
        assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls, ts.id
        checked += 1
    assert checked >= MIN_ANSWERS


def test_an_answer_missing_a_required_argument_or_with_an_undeclared_one_is_refused(tool_sets, compiled,
                                                                                     tokenizer):
    checked = 0
    for ts, got in zip(tool_sets, compiled):
        calls = _valid_answer(ts) if not isinstance(got, REFUSED) else None
        if calls is None:
            continue
        name, args = calls[0]
        required = next(t for t in ts.tools if t["function"]["name"] == name)["function"]["parameters"].get("required")
        if not required or required[0] not in args:
            continue
        broken = [(name, {k: v for k, v in args.items() if k != required[0]})] + calls[1:]
        assert not _matches(got[1], tokenizer, _call_text(got[0], ts, broken)), ts.id
        extra = [(name, {**args, "undeclared_argument": 1})] + calls[1:]
        assert not _matches(got[1], tokenizer, _call_text(got[0], ts, extra)), ts.id
        checked += 1
    assert checked >= MIN_ANSWERS // 2


def test_auto_mode_takes_text_then_the_calls(tool_sets, tokenizer, backend):
    checked = 0
    for ts in tool_sets[::AUTO_EVERY]:
        calls = _valid_answer(ts)
        if calls is None or _unsatisfiable(ts):
            continue
        plan = plan_tools({"tools": list(ts.tools)}, tokenizer, "auto", GRAMMAR_BACKEND, GrammarOptions())
        grammar = backend.compile("ebnf", plan.grammar)
        text = "Let me call the tools.\n" + _call_text(plan, ts, calls)
        assert _matches(grammar, tokenizer, text), (ts.id, text[:300])
        assert [c.name for c in plan.accepted_calls(text)] == [n for n, _ in calls], ts.id
        checked += 1
    assert checked >= MIN_ANSWERS // AUTO_EVERY - 10


@pytest.mark.parametrize("family", ["llama3", "mistral"])
def test_the_other_families_take_the_right_answers(tool_sets, tokenizer, backend, family):
    """The same answers in the llama3 (`<|python_tag|>{...};{...}`) and mistral (`[TOOL_CALLS][{...}]`)
    call syntax, on an evenly spaced sample of the sets."""
    checked = 0
    for ts in tool_sets[::AUTO_EVERY]:
        calls = _valid_answer(ts)
        if calls is None or _unsatisfiable(ts):
            continue
        plan = plan_tools({"tools": list(ts.tools), "tool_choice": "required"}, tokenizer, family, GRAMMAR_BACKEND,
                          GrammarOptions())
        assert plan.fmt.name == family
        text = _call_text(plan, ts, calls)
        assert _matches(backend.compile("ebnf", plan.grammar), tokenizer, text), (ts.id, text[:300])
        assert [(c.name, json.loads(c.arguments)) for c in plan.accepted_calls(text)] == calls, ts.id
        checked += 1
    assert checked >= MIN_ANSWERS // AUTO_EVERY - 10
