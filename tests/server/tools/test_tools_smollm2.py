"""Tool calling end to end: the official openai client (and LangChain's ChatOpenAI) against `radixlm serve`
on the real SmolLM2 with the llguidance grammar backend. Every returned `arguments` string must parse and
validate against its tool's schema, in every tool_choice mode, streamed or not, sampled or greedy."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from radixlm.tools.parsers.base import decode_at
from tests.server.conftest import TENANT_KEYS, ServerProcess
from tests.server.tools.conftest import SCHEMAS, TOOLS

pytestmark = pytest.mark.slow

MODEL = "smollm2"
ASK = [{"role": "user", "content": "What is the weather in Paris? Also, what is 12 times 7?"}]
NAMED = {"type": "function", "function": {"name": "calculator"}}


@pytest.fixture(scope="module")
def tool_server():
    srv = ServerProcess(None, "--served-model-name", MODEL, "--grammar-backend", "llguidance",
                        "--num-threads", "1").wait_ready()  # 1 thread: a shared, loaded CI machine
    yield srv
    srv.stop()
    srv.remove_tmpdir()


@pytest.fixture(scope="module")
def oai(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key=TENANT_KEYS[0], max_retries=0, timeout=300)


def _valid(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


def _chat(oai, **kw):
    return oai.chat.completions.create(model=MODEL, messages=kw.pop("messages", ASK), tools=TOOLS, **kw)


def _assemble_stream(chunks):
    content, calls, reasons, arg_pieces = "", {}, [], 0
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": call.id, "name": None, "arguments": ""})
                if call.function.name:
                    slot["name"] = call.function.name
                if call.function.arguments:
                    slot["arguments"] += call.function.arguments
                    arg_pieces += 1
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return content, [calls[i] for i in sorted(calls)], reasons, arg_pieces


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_required_and_named_give_valid_calls(oai, choice):
    res = _chat(oai, tool_choice=choice, parallel_tool_calls=False, max_tokens=64, temperature=0)
    msg, reason = res.choices[0].message, res.choices[0].finish_reason
    assert reason == "tool_calls" and msg.content is None and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    if choice == NAMED:
        assert call.function.name == "calculator"
    _valid(call.function.name, call.function.arguments)


def test_none_and_auto(oai):
    res = _chat(oai, tool_choice="none", max_tokens=24, temperature=0)
    assert res.choices[0].message.tool_calls is None and res.choices[0].message.content
    res = _chat(oai, tool_choice="auto", max_tokens=64, temperature=0.8, n=6, seed=3)
    for choice in res.choices:  # the model may answer or call; a call is always valid
        for call in choice.message.tool_calls or []:
            _valid(call.function.name, call.function.arguments)
        assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)


@pytest.mark.parametrize("choice", ["required", NAMED, "auto"], ids=["required", "named", "auto"])
def test_streamed_arguments_grow_and_validate(oai, choice):
    stream = _chat(oai, tool_choice=choice, parallel_tool_calls=False, max_tokens=64, temperature=0, stream=True)
    content, calls, reasons, pieces = _assemble_stream(stream)
    assert len(reasons) == 1
    if choice == "auto" and not calls:
        assert content and reasons == ["stop"] or reasons == ["length"]
        return
    assert reasons == ["tool_calls"] and len(calls) == 1 and pieces >= 2
    assert calls[0]["id"].startswith("call_")
    _valid(calls[0]["name"], calls[0]["arguments"])
    res = _chat(oai, tool_choice=choice, parallel_tool_calls=False, max_tokens=64, temperature=0)
    call = res.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == (calls[0]["name"], calls[0]["arguments"])


def test_parallel_calls(oai):
    res = _chat(oai, tool_choice="required", max_tokens=120, temperature=0.7, n=8, seed=1)
    counts = []
    for choice in res.choices:
        calls = choice.message.tool_calls or []
        counts.append(len(calls))
        for call in calls:
            _valid(call.function.name, call.function.arguments)
        assert len({c.id for c in calls}) == len(calls)
    assert max(counts) >= 2, counts  # the grammar allows several calls and the model writes them
    single = _chat(oai, tool_choice="required", parallel_tool_calls=False, max_tokens=120, temperature=0.7, n=4,
                   seed=1)
    assert all(len(c.message.tool_calls) == 1 for c in single.choices)


def _run_tool(name: str, args: dict) -> str:
    if name == "calculator":
        a, b, op = args["a"], args["b"], args["op"]
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else float("nan")}[op]
        return json.dumps({"result": value})
    return json.dumps({"city": args["city"], "temperature": 18, "unit": args.get("unit", "celsius")})


def test_two_turn_tool_loop(oai):
    messages = list(ASK)
    first = _chat(oai, messages=messages, tool_choice="required", parallel_tool_calls=False, max_tokens=64,
                  temperature=0).choices[0].message
    call = first.tool_calls[0]
    messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": _run_tool(call.function.name, _valid(call.function.name, call.function.arguments))})
    second = _chat(oai, messages=messages, tool_choice="none", max_tokens=32, temperature=0).choices[0]
    assert second.message.content and not second.message.tool_calls
    assert second.finish_reason in ("stop", "length")


def test_sampled_calls_always_validate(oai):
    """>= 50 generated calls with sampling on (temperature 1): every one parses and validates."""
    prompts = ["What is the weather in Tokyo?", "Compute 3.5 minus 8.", "Is it raining in Lima, in fahrenheit?",
               "Multiply 41 by 9.", "Weather for Oslo and Cairo please.", "Divide 100 by 7."]

    def ask(k: int):
        choice = "required" if k % 2 == 0 else NAMED
        return _chat(oai, messages=[{"role": "user", "content": prompts[k]}], tool_choice=choice,
                     parallel_tool_calls=False, max_tokens=72, temperature=1.0, top_p=0.95, n=10, seed=k)

    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(ask, range(len(prompts))))
    validated = cut = 0
    for res in results:
        for choice in res.choices:
            if choice.finish_reason == "length":  # max_tokens inside a call: its arguments are partial
                cut += 1
                continue
            assert choice.finish_reason == "tool_calls", choice
            for call in choice.message.tool_calls:
                _valid(call.function.name, call.function.arguments)
                validated += 1
    print(f"sampled tool calls: {validated} validated, {cut} cut by max_tokens, of {validated + cut}")
    assert validated >= 50


def test_bad_tool_requests_are_400(oai):
    for kw in ({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
               {"tool_choice": "sometimes"}, {"parallel_tool_calls": "yes"}):
        with pytest.raises(openai.BadRequestError):
            _chat(oai, max_tokens=4, **kw)
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$ref": "http://x"}}}]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=bad, tool_choice="required", max_tokens=4)


def test_langchain_bind_tools_round_trip(tool_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = langchain_openai.ChatOpenAI(model=MODEL, base_url=tool_server.url + "/v1", api_key=TENANT_KEYS[0],
                                      temperature=0, max_tokens=64, max_retries=0, timeout=300)
    bound = llm.bind_tools(TOOLS, tool_choice="calculator", parallel_tool_calls=False)
    messages = [HumanMessage("What is 12 times 7?")]
    ai = bound.invoke(messages)
    assert len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "calculator"
    args = ai.tool_calls[0]["args"]
    jsonschema.validate(args, SCHEMAS["calculator"])
    messages += [ai, ToolMessage(_run_tool("calculator", args), tool_call_id=ai.tool_calls[0]["id"])]
    final = llm.bind_tools(TOOLS, tool_choice="none").invoke(messages)
    assert final.content and not final.tool_calls


def test_native_structural_tag(tool_server):
    """/generate with SGLang's structural_tag: after every trigger (here each newline) comes a JSON object
    that validates, the text between is free."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "country": {"type": "string", "maxLength": 16}},
              "required": ["city", "country"], "additionalProperties": False}
    tag = {"type": "structural_tag", "triggers": ["\n"], "structures": [{"begin": "\n", "schema": schema, "end": ""}]}
    params = {"max_new_tokens": 64, "temperature": 0.8, "n": 4, "sampling_seed": 5, "structural_tag": tag}
    with tool_server.client(timeout=300) as client:
        res = client.post("/generate", json={"text": "Three cities and their countries, one per line:",
                                             "sampling_params": params})
    assert res.status_code == 200, res.text
    segments = 0
    for out in res.json():
        text = out["text"]
        for k in [i for i, ch in enumerate(text) if ch == "\n"]:
            got = decode_at(text, k + 1)
            if got is None:  # only the last segment may be cut by max_new_tokens
                assert out["meta_info"]["finish_reason"]["type"] == "length" and "\n" not in text[k + 1:]
                continue
            jsonschema.validate(got[0], schema)
            segments += 1
    assert segments >= 1
    with tool_server.client() as client:
        bad = client.post("/generate", json={"text": "x", "sampling_params": {"structural_tag": {"type": "x"}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "structural_tag"


def test_frontend_gen_tools_through_openai_backend(tool_server):
    """gen(tools=...) on the frontend's OpenAI backend: tools pass through /v1, calls come back as dicts."""
    import radixlm as sgl

    backend = sgl.OpenAI(MODEL, base_url=tool_server.url + "/v1", api_key=TENANT_KEYS[0], is_chat_model=True)

    @sgl.function
    def agent(s):
        s += sgl.user("What is 12 times 7?")
        s += sgl.assistant(sgl.gen("call", tools=TOOLS, tool_choice=NAMED, max_tokens=64, temperature=0))
        call = s.get_meta_info("call")["tool_calls"][0]
        s += sgl.user("Tool result: " + _run_tool(call["name"], call["arguments"]))
        s += sgl.assistant(sgl.gen("answer", max_tokens=16, temperature=0))

    state = agent.run(backend=backend)
    call = state.get_meta_info("call")["tool_calls"][0]
    assert call["name"] == "calculator" and call["id"].startswith("call_")
    jsonschema.validate(call["arguments"], SCHEMAS["calculator"])
    assert state["answer"]
