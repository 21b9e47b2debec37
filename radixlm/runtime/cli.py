"""The `radixlm` command line: argparse <-> engine options. The only module that knows CLI flags.

Runs in the user's process. `radixlm generate "prompt"` streams a reply from the default model
(SmolLM2-135M-Instruct unless --model-path says otherwise); `radixlm chat` is an interactive chat.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from radixlm.runtime.config import CacheConfig, GrammarConfig, ModelConfig, SchedulerConfig, ServerConfig


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine flags, spelled as SGLang spells them."""
    p.add_argument("--model-path", default=None, help="HF directory or .gguf file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--dtype", default=ModelConfig.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default=ModelConfig.device)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--num-threads", type=int, default=None, help="torch threads on CPU (default: all cores)")
    p.add_argument("--attention-backend", default=ModelConfig.attention_backend, choices=["auto", "torch", "triton"])
    p.add_argument("--max-total-tokens", type=int, default=None, help="KV cache capacity in tokens")
    p.add_argument("--mem-fraction-static", type=float, default=CacheConfig.mem_fraction_static)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--max-running-requests", type=int, default=SchedulerConfig.max_running_requests)
    p.add_argument("--chunked-prefill-size", type=int, default=SchedulerConfig.chunked_prefill_size)
    p.add_argument("--schedule-policy", default=SchedulerConfig.schedule_policy,
                   choices=["lpm", "dfs-weight", "fcfs", "lof", "random"])
    p.add_argument("--tp-size", type=int, default=ModelConfig.tp_size, help="tensor-parallel ranks (docs/scaling.md)")
    p.add_argument("--nnodes", type=int, default=ModelConfig.nnodes, help="machines the tp ranks span")
    p.add_argument("--node-rank", type=int, default=ModelConfig.node_rank, help="this machine (0 runs the server)")
    p.add_argument("--dist-init-addr", default=None, help="host:port of node 0's torch.distributed rendezvous")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ["tokenizer_path", "dtype", "device", "context_length", "num_threads", "attention_backend",
            "max_total_tokens", "mem_fraction_static", "disable_radix_cache", "max_running_requests",
            "chunked_prefill_size", "schedule_policy", "tp_size", "nnodes", "node_rank", "dist_init_addr"]
    return {k: getattr(args, k) for k in keys}


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "sampling_seed": args.seed}


def _stream_reply(engine, prompt: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    printed = ""
    last: dict[str, Any] = {}
    for chunk in engine.generate(prompt, params, stream=True):
        text = chunk["text"]
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
        printed, last = text, chunk
    sys.stdout.write("\n")
    return printed, last.get("meta_info", {})


def _chat_prompt(engine, messages: list[dict[str, str]]) -> str:
    return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def cmd_generate(args: argparse.Namespace) -> int:
    from radixlm.runtime.engine import Engine

    t0 = time.perf_counter()
    with Engine(args.model_path, **engine_options(args)) as engine:
        load_s = time.perf_counter() - t0
        prompt = args.prompt if args.raw else _chat_prompt(engine, [{"role": "user", "content": args.prompt}])
        t1 = time.perf_counter()
        _, meta = _stream_reply(engine, prompt, _params(args))
        dt = time.perf_counter() - t1
        n = meta.get("completion_tokens", 0)
        print(f"[{n} tokens in {dt:.2f}s, {n / dt if dt else 0:.1f} tok/s; model loaded in {load_s:.1f}s; "
              f"{engine.runner.info.num_threads} threads]", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from radixlm.runtime.engine import Engine

    with Engine(args.model_path, **engine_options(args)) as engine:
        messages: list[dict[str, str]] = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        print("radixlm chat: an empty line or Ctrl-D quits.", file=sys.stderr)
        while True:
            try:
                line = input("> ").strip()
            except EOFError:
                break
            if not line:
                break
            messages.append({"role": "user", "content": line})
            reply, meta = _stream_reply(engine, _chat_prompt(engine, messages), _params(args))
            messages.append({"role": "assistant", "content": reply})
            print(f"[cached {meta.get('cached_tokens', 0)}/{meta.get('prompt_tokens', 0)} prompt tokens]",
                  file=sys.stderr)
    return 0


def add_server_args(p: argparse.ArgumentParser) -> None:
    """HTTP server flags (SGLang's names where SGLang has the flag) and the robustness.md limits."""
    p.add_argument("--host", default=ServerConfig.host)
    p.add_argument("--port", type=int, default=ServerConfig.port)
    p.add_argument("--api-key", action="append", default=None,
                   help="require this key (Authorization: Bearer); repeat for several tenants")
    p.add_argument("--admin-api-key", default=None, help="key for the admin debug endpoint")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--grammar-backend", default=GrammarConfig.grammar_backend,
                   choices=["outlines", "xgrammar", "llguidance"],
                   help="constrained-decoding engine (docs/constrained.md)")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--log-level", default=ServerConfig.log_level,
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--max-queued-requests", type=int, default=SchedulerConfig.max_queued_requests)
    p.add_argument("--max-body-bytes", type=int, default=ServerConfig.max_body_bytes)
    p.add_argument("--max-prompt-chars", type=int, default=ServerConfig.max_prompt_chars)
    p.add_argument("--watchdog-timeout", type=float, default=ServerConfig.watchdog_timeout)
    p.add_argument("--drain-timeout", type=float, default=ServerConfig.drain_timeout)
    p.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=ServerConfig.dp_size,
                   help="data-parallel scheduler processes in this server, one model copy each (docs/scaling.md)")
    p.add_argument("--dp-load-balance", "--load-balance-method", dest="dp_load_balance",
                   default=ServerConfig.dp_load_balance, choices=["cache_aware", "round_robin"],
                   help="how --dp-size picks a scheduler for each request")
    _agent_args(p)


def _agent_args(p: argparse.ArgumentParser) -> None:
    from radixlm.runtime.server.reasoning import PARSERS as REASONING_PARSERS
    from radixlm.runtime.server.tools.parsers.registry import CHOICES as TOOL_PARSERS

    p.add_argument("--tool-call-parser", default=ServerConfig.tool_call_parser, choices=list(TOOL_PARSERS),
                   help="tool-call syntax of /v1 tool calling (auto: from the chat template)")
    p.add_argument("--reasoning-parser", default=None, choices=list(REASONING_PARSERS),
                   help="split <think>...</think> into message.reasoning_content")


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host, port=args.port, api_keys=tuple(args.api_key or ()), admin_api_key=args.admin_api_key,
        served_model_name=args.served_model_name, enable_metrics=args.enable_metrics, log_level=args.log_level,
        max_body_bytes=args.max_body_bytes,
        max_prompt_chars=args.max_prompt_chars, watchdog_timeout=args.watchdog_timeout,
        drain_timeout=args.drain_timeout, dp_size=args.dp_size, dp_load_balance=args.dp_load_balance,
        tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser)


def cmd_serve(args: argparse.Namespace) -> int:
    from radixlm.runtime.config import EngineConfig
    from radixlm.runtime.launch import check_dp_options, exit_now, launch_server

    options = {**engine_options(args), "max_queued_requests": args.max_queued_requests,
               "grammar_backend": args.grammar_backend}
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
    code = launch_server(engine_config, config)
    exit_now(code)  # skip interpreter teardown (torch/ZMQ finalizers can stall for seconds)
    return code


def build_serve_parser(prog: str = "radixlm serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Serve the native and OpenAI HTTP APIs.")
    add_engine_args(parser)
    add_server_args(parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlm", description="Structured LLM programs, served fast.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="stream one reply to a prompt")
    gen.add_argument("prompt")
    gen.add_argument("--raw", action="store_true", help="send the prompt as is (no chat template)")
    add_engine_args(gen)
    _sampling_args(gen)
    gen.set_defaults(func=cmd_generate)
    chat = sub.add_parser("chat", help="interactive multi-turn chat")
    chat.add_argument("--system", default=None)
    add_engine_args(chat)
    _sampling_args(chat)
    chat.set_defaults(func=cmd_chat)
    serve = sub.add_parser("serve", help="run the HTTP server (native + OpenAI APIs)")
    add_engine_args(serve)
    add_server_args(serve)
    serve.set_defaults(func=cmd_serve)
    from radixlm import showcase  # the frontend only (no torch) until the command runs

    show = sub.add_parser("showcase", help="run example programs on the default model; print the cache hit rate")
    showcase.add_args(show)
    show.set_defaults(func=showcase.cmd_showcase)
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
