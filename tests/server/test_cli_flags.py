"""`radixlm serve` / `python -m radixlm.launch_server` flags: SGLang's names map onto the frozen configs."""

from __future__ import annotations

import dataclasses

import pytest

from radixlm.runtime.cli import build_parser, build_serve_parser, engine_options, server_config
from radixlm.runtime.config import EngineConfig, ServerConfig

SGLANG_FLAGS = ["--model-path", "m", "--tokenizer-path", "t", "--host", "0.0.0.0", "--port", "31000",
                "--api-key", "k1", "--api-key", "k2", "--served-model-name", "s", "--context-length", "256",
                "--dtype", "float32", "--chunked-prefill-size", "64", "--max-running-requests", "8",
                "--max-total-tokens", "1000", "--mem-fraction-static", "0.5", "--schedule-policy", "fcfs",
                "--disable-radix-cache", "--grammar-backend", "xgrammar", "--enable-metrics", "--log-level", "error"]


def test_sglang_flag_names_parse_into_configs():
    args = build_serve_parser().parse_args(SGLANG_FLAGS + ["--max-queued-requests", "3", "--admin-api-key", "a"])
    cfg = server_config(args)
    assert (cfg.host, cfg.port, cfg.api_keys, cfg.served_model_name) == ("0.0.0.0", 31000, ("k1", "k2"), "s")
    assert cfg.enable_metrics and cfg.log_level == "error" and cfg.admin_api_key == "a"
    engine = EngineConfig.from_options("m", **engine_options(args))  # the engine flags include both
    assert engine.grammar.grammar_backend == "xgrammar"
    assert engine.model.context_length == 256 and engine.cache.max_total_tokens == 1000
    assert engine.cache.disable_radix_cache and engine.scheduler.schedule_policy == "fcfs"
    assert engine.scheduler.max_running_requests == 8 and engine.scheduler.max_queued_requests == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1  # type: ignore[misc]


def test_serve_subcommand_and_defaults():
    args = build_parser().parse_args(["serve", "--port", "30001"])
    assert args.func.__name__ == "cmd_serve" and args.model_path is None
    cfg = server_config(args)
    assert (cfg.host, cfg.port, cfg.api_keys, cfg.max_body_bytes) == ("127.0.0.1", 30001, (), 8 << 20)
    assert ServerConfig().port == 30000


def test_agent_flag_choices_are_the_parsers():
    from radixlm.runtime.cli_flags import _EXTRAS
    from radixlm.runtime.server.reasoning import PARSERS
    from radixlm.tools.parsers.registry import CHOICES

    assert _EXTRAS["tool_call_parser"].choices == CHOICES
    assert set(_EXTRAS["reasoning_parser"].choices) == set(PARSERS)


@pytest.mark.parametrize("argv, message", [
    (["generate", "--temperature", "5", "hi"], "radixlm generate: error: --temperature: must be in [0, 2]"),
    (["chat", "--top-k", "0"], "radixlm chat: error: --top-k: must be -1 (disabled) or >= 1"),
    (["generate", "--model-path", "Org/some-hub-model", "hi"],
     "radixlm generate: error: --model-path Org/some-hub-model: no such file or directory"),
    (["serve", "--model-path", "Org/some-hub-model"],
     "radixlm serve: error: --model-path Org/some-hub-model: no such file or directory"),
])
def test_a_bad_flag_is_one_line_and_exit_2_before_anything_loads(argv, message, capsys, monkeypatch):
    import radixlm.runtime.engine as engine_module

    def no_engine(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(engine_module, "Engine", no_engine)
    from radixlm.runtime.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("parser", [build_parser, build_serve_parser])
def test_version_flag(parser, capsys):
    import radixlm

    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"radixlm {radixlm.__version__}\n"
