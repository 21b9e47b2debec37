"""The `radixlm` command line: subcommands over the flags cli_flags.py generates from the configs.

Runs in the user's process. `radixlm generate "prompt"` streams a reply from the default model
(SmolLM2-135M-Instruct unless --model-path says otherwise); `radixlm chat` is an interactive chat
(runtime/chat_repl.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from radixlm.runtime.cli_flags import (ENGINE_CONFIGS, add_dataclass_flags, add_sampling_flags, dataclass_values,
                                      sampling_values)
from radixlm.runtime.config import ServerConfig


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine flags: one per field of the engine configs (cli_flags.py), spelled as SGLang spells them."""
    group = p.add_argument_group("engine")
    for cls in ENGINE_CONFIGS:
        add_dataclass_flags(group, cls)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig.from_options keywords (all but model_path, which the commands pass on its own)."""
    return {k: v for cls in ENGINE_CONFIGS for k, v in dataclass_values(args, cls, skip=("model_path",)).items()}


# Chat's default: the small default model repeats itself easily over a long reply.
CHAT_REPETITION_PENALTY = 1.1


def _chat_prompt(engine, messages: list[dict[str, str]]) -> str:
    return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class UsageError(ValueError):
    """A flag that cannot work, found before anything loads: one line on stderr, exit code 2."""


def check_before_load(args: argparse.Namespace, sampling: bool) -> None:
    """Validate what the user typed before the model loads (tens of seconds), so a mistake costs a second."""
    from radixlm.runtime.config import EngineConfig
    from radixlm.sampling_params import SamplingParamError, SamplingParams

    path = args.model_path
    if path is not None and not Path(path).expanduser().exists():
        raise UsageError(f"--model-path {path}: no such file or directory (radixlm does not download from a "
                         "model hub: pass a local HF-format directory or a .gguf file, or no path for the "
                         "default model)")
    try:
        EngineConfig.from_options(path, **engine_options(args))
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if sampling:
        try:
            SamplingParams.from_dict(sampling_values(args))
        except SamplingParamError as exc:
            raise UsageError(f"--{exc.param.replace('_', '-')}: {str(exc).split(': ', 1)[-1]}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from radixlm.runtime.chat_repl import stream_reply
    from radixlm.runtime.engine import Engine

    check_before_load(args, sampling=True)
    t0 = time.perf_counter()
    with Engine(args.model_path, **engine_options(args)) as engine:
        load_s = time.perf_counter() - t0
        prompt = args.prompt if args.raw else _chat_prompt(engine, [{"role": "user", "content": args.prompt}])
        t1 = time.perf_counter()
        _, meta, _ = stream_reply(engine, prompt, sampling_values(args))
        dt = time.perf_counter() - t1
        n = meta.get("completion_tokens", 0)
        print(f"[{n} tokens in {dt:.2f}s, {n / dt if dt else 0:.1f} tok/s; model loaded in {load_s:.1f}s; "
              f"{engine.runner.info.num_threads} threads]", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from radixlm.runtime.chat_repl import run_chat
    from radixlm.runtime.engine import Engine

    check_before_load(args, sampling=True)
    with Engine(args.model_path, **engine_options(args)) as engine:
        return run_chat(engine, args.system, sampling_values(args))


def add_server_args(p: argparse.ArgumentParser) -> None:
    """HTTP server flags: one per ServerConfig field (SGLang's names where SGLang has the flag)."""
    add_dataclass_flags(p.add_argument_group("server"), ServerConfig)


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(**dataclass_values(args, ServerConfig))


def cmd_serve(args: argparse.Namespace) -> int:
    from radixlm.runtime.config import EngineConfig
    from radixlm.runtime.launch import PortInUseError, check_dp_options, launch_server
    from radixlm.runtime.proc import exit_now

    try:
        check_before_load(args, sampling=False)
    except UsageError as exc:
        print(f"radixlm serve: error: {exc}", file=sys.stderr)
        return 2
    options = engine_options(args)
    if args.node_rank > 0:  # multi-node tensor parallelism: other machines only host worker ranks
        from radixlm.runtime.model.tp_worker import launch_node

        return launch_node(EngineConfig.from_options(args.model_path, **options).model)
    engine_config = EngineConfig.from_options(args.model_path, **options)
    try:
        config = server_config(args)
        check_dp_options(engine_config, config)
    except ValueError as exc:  # e.g. --dp-size 0, or --dp-size with --tp-size: refused before any process
        print(f"radixlm serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        code = launch_server(engine_config, config)
    except PortInUseError as exc:  # before the model loads: nothing to clean up
        print(f"radixlm serve: error: {exc}", file=sys.stderr)
        return 2
    exit_now(code)  # skip interpreter teardown (torch/ZMQ finalizers can stall for seconds)
    return code


def cmd_showcase(args: argparse.Namespace) -> int:
    # Imported here: the showcase is a frontend program (radixlm.lang), not part of the CLI's import graph.
    from radixlm import showcase

    return showcase.cmd_showcase(args)


def _add_version(parser: argparse.ArgumentParser) -> None:
    from radixlm import __version__

    parser.add_argument("--version", action="version", version=f"radixlm {__version__}")


def build_serve_parser(prog: str = "radixlm serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Serve the native and OpenAI HTTP APIs.")
    _add_version(parser)
    add_engine_args(parser)
    add_server_args(parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlm", description="Structured LLM programs, served fast.")
    _add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="stream one reply to a prompt")
    gen.add_argument("prompt")
    gen.add_argument("--raw", action="store_true", help="send the prompt as is (no chat template)")
    add_engine_args(gen)
    add_sampling_flags(gen)
    gen.set_defaults(func=cmd_generate)
    chat = sub.add_parser("chat", help="interactive multi-turn chat")
    chat.add_argument("--system", default=None)
    add_engine_args(chat)
    add_sampling_flags(chat)
    chat.set_defaults(func=cmd_chat, repetition_penalty=CHAT_REPETITION_PENALTY)
    serve = sub.add_parser("serve", help="run the HTTP server (native + OpenAI APIs)")
    add_engine_args(serve)
    add_server_args(serve)
    serve.set_defaults(func=cmd_serve)
    show = sub.add_parser("showcase", help="run example programs on the default model; print the cache hit rate")
    add_engine_args(show)  # all radixlm.showcase takes
    show.set_defaults(func=cmd_showcase)
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    from radixlm.runtime.model.default_model import DefaultModelUnavailable

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DefaultModelUnavailable as exc:  # offline on first use: the fix, not a traceback
        print(f"radixlm: error: {exc}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"radixlm {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
