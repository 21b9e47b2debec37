"""One source for the sampling parameters: every SamplingParams field is accepted, under its own name, by
gen, run, run_batch (radixlm.lang over the real server), the CLI (`radixlm generate` flags) and /generate;
and every engine / server config field has a CLI flag."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import radixlm as sgl
from radixlm.runtime.cli import build_parser, build_serve_parser, engine_options, server_config
from radixlm.runtime.cli_flags import ENGINE_CONFIGS, sampling_values
from radixlm.runtime.config import EngineConfig, ServerConfig
from radixlm.sampling_params import SamplingParams
from tests.server.conftest import TENANT_KEYS

# A valid, non-default value of every field; the first assertion makes a new field extend this table.
VALUES: dict[str, Any] = {
    "max_new_tokens": 3, "min_new_tokens": 1, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.05,
    "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.1, "stop": ["zz"],
    "stop_token_ids": [3], "stop_regex": ["q{3}"], "ignore_eos": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "no_stop_trim": True, "n": 2, "logit_bias": {5: 1.0},
    "sampling_seed": 7, "regex": "[ab]+", "json_schema": '{"type": "string"}', "ebnf": 'root ::= "a"',
    "choices": ["yes", "no"],
    "structural_tag": {"type": "structural_tag", "triggers": ["<f>"],
                       "structures": [{"begin": "<f>", "schema": {"type": "integer"}, "end": "</f>"}]},
}
# The CLI spelling of each value (repeatable flags take one value per occurrence).
CLI_ARGS: dict[str, list[str]] = {
    "stop": ["--stop", "zz"], "stop_token_ids": ["--stop-token-ids", "3"], "stop_regex": ["--stop-regex", "q{3}"],
    "ignore_eos": ["--ignore-eos"], "skip_special_tokens": ["--no-skip-special-tokens"],
    "spaces_between_special_tokens": ["--no-spaces-between-special-tokens"], "no_stop_trim": ["--no-stop-trim"],
    "logit_bias": ["--logit-bias", '{"5": 1.0}'], "sampling_seed": ["--seed", "7"],
    "choices": ["--choices", "yes", "--choices", "no"],
    "structural_tag": ["--structural-tag", json.dumps(VALUES["structural_tag"])],
}
FIELDS = list(SamplingParams.__struct_fields__)


def test_the_table_covers_every_field():
    assert set(VALUES) == set(FIELDS)


def _request_params(name: str) -> dict[str, Any]:
    """The field under test, with a short output (ebnf has no backend here: outlines compiles none)."""
    params = {name: VALUES[name]}
    if name not in ("max_new_tokens", "min_new_tokens"):
        params["max_new_tokens"] = 2
    return params


def _accepted(status: int, body: Any, name: str) -> bool:
    """200, or (ebnf only) the grammar backend's own 400 naming the field: the parameter was understood."""
    if status == 200:
        return True
    error = body.get("error", {}) if isinstance(body, dict) else {}
    return name == "ebnf" and status == 400 and error.get("param") == "ebnf" and "unknown" not in str(error)


@pytest.mark.parametrize("name", FIELDS)
def test_generate_route_accepts(client, name):
    res = client.post("/generate", json={"text": "Hello", "sampling_params": _request_params(name)})
    assert _accepted(res.status_code, res.json(), name), res.text


@pytest.mark.parametrize("name", FIELDS)
def test_cli_flag_for_every_sampling_field(name):
    flags = CLI_ARGS.get(name, ["--" + name.replace("_", "-"), str(VALUES[name])])
    values = sampling_values(build_parser().parse_args(["generate", "hi", *flags]))
    if name == "structural_tag":  # lowered to its `ebnf` grammar when SamplingParams are built
        from radixlm.constrained.structural_tag import structural_tag_to_lark

        assert SamplingParams.from_dict(values).to_dict()["ebnf"] == structural_tag_to_lark(VALUES[name])
        return
    assert SamplingParams.from_dict(values).to_dict()[name] == SamplingParams(**VALUES).to_dict()[name]


def test_every_config_field_has_a_flag():
    serve = build_serve_parser().parse_args([])
    options = engine_options(serve)
    expected = {f.name for cls in ENGINE_CONFIGS for f in dataclasses.fields(cls)} - {"model_path"}
    assert set(options) == expected
    assert EngineConfig.from_options(None, **options) == EngineConfig()  # the flags' defaults are the configs'
    assert server_config(serve) == ServerConfig()
    args = build_serve_parser().parse_args(["--disable-cuda-graph", "--no-enable-mixed-chunk", "--disable-jump-forward",
                                            "--random-seed", "3", "--weight-layout", "row", "--cuda-graph-max-bs", "8",
                                            "--small-step-threads", "1", "--new-token-ratio", "0.5",
                                            "--constrained-json-whitespace-pattern", "[ ]?",
                                            "--grammar-compile-timeout", "2", "--grammar-num-workers", "1",
                                            "--startup-timeout", "9", "--health-generate-timeout", "4"])
    cfg = EngineConfig.from_options(None, **engine_options(args))
    assert (cfg.model.disable_cuda_graph, cfg.model.seed, cfg.model.weight_layout, cfg.model.cuda_graph_max_bs,
            cfg.model.small_step_threads) == (True, 3, "row", 8, 1)
    assert (cfg.scheduler.enable_mixed_chunk, cfg.scheduler.new_token_ratio) == (False, 0.5)
    assert (cfg.grammar.disable_jump_forward, cfg.grammar.constrained_json_whitespace_pattern,
            cfg.grammar.grammar_compile_timeout, cfg.grammar.grammar_num_workers) == (True, "[ ]?", 2.0, 1)
    assert (server_config(args).startup_timeout, server_config(args).health_generate_timeout) == (9.0, 4.0)


class _Recording:
    """The backend's transport, keeping every /generate payload it sends."""

    def __init__(self, inner: Any):
        self.inner, self.payloads = inner, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, payload: dict[str, Any]) -> Any:
        self.payloads.append(payload)
        return self.inner.generate(payload)


@pytest.fixture(scope="module")
def backend(server):
    b = sgl.RuntimeEndpoint(server.url, api_key=TENANT_KEYS[0])
    b.transport = _Recording(b.transport)
    yield b
    b.shutdown()


@sgl.function
def _gen_with(s, opts):
    s += "Hi" + sgl.gen("answer", **opts)


@sgl.function
def _plain_gen(s, question):
    s += question + sgl.gen("answer")


@pytest.mark.parametrize("name", [n for n in FIELDS if n != "ebnf"])
@pytest.mark.parametrize("entry", ["gen", "run", "run_batch"])
def test_frontend_accepts_and_sends(backend, name, entry):
    """gen's options, and run / run_batch defaults, reach the /generate payload under the field's name.
    gen(choices=...) is select (tested with select); ebnf: below (the test server compiles no EBNF)."""
    if entry == "gen" and name == "choices":
        pytest.skip("gen(choices=...) is select")
    params = _request_params(name)
    if entry == "gen":
        state = _gen_with.run(opts=params, backend=backend)
    elif entry == "run":
        state = _plain_gen.run("Hi", backend=backend, **params)
    else:
        state = _plain_gen.run_batch([{"question": "Hi"}], backend=backend, **params)[0]
    assert state["answer"] is not None
    sent = backend.transport.payloads[-1]["sampling_params"][name]
    if name == "stop":  # the chat template's stop strings come after the program's
        sent = sent[: len(VALUES[name])]
    assert sent == VALUES[name]


@pytest.mark.parametrize("entry", ["gen", "run"])
def test_frontend_sends_ebnf(entry):
    from radixlm.lang.params import GenParams

    if entry == "gen":
        params = sgl.gen("x", ebnf=VALUES["ebnf"]).sampling_params
    else:
        params = _plain_gen._split_options({"ebnf": VALUES["ebnf"]})[0]
    assert isinstance(params, GenParams)
    assert params.to_native_sampling_params()["ebnf"] == VALUES["ebnf"]

