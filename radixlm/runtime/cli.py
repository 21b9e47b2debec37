"""The `radixlm` command line: argparse <-> engine options. The only module that knows CLI flags.

Runs in the user's process. `radixlm generate "prompt"` streams a reply from the default model
(SmolLM2-135M-Instruct unless --model-path says otherwise); `radixlm chat` is an interactive chat.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from radixlm.runtime.config import CacheConfig, ModelConfig, SchedulerConfig


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


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ["tokenizer_path", "dtype", "device", "context_length", "num_threads", "attention_backend",
            "max_total_tokens", "mem_fraction_static", "disable_radix_cache", "max_running_requests",
            "chunked_prefill_size", "schedule_policy"]
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
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
