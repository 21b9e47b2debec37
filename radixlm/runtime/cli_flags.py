"""Command-line flags generated from the frozen config dataclasses and from SamplingParams (a msgspec Struct).

Runs in the user's process. Every field of ModelConfig, CacheConfig, SchedulerConfig, GrammarConfig
(engine flags), ServerConfig (server flags) and SamplingParams (`radixlm generate` / `chat`) gets a flag
`--field-name` whose type and default come from the field; `_EXTRAS` adds only what a dataclass cannot
say: SGLang's spelling where it differs, choices, help, and the CLI's own sampling defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

import msgspec

from radixlm.runtime.config import (CacheConfig, GrammarConfig, ModelConfig, SchedulerConfig, ServerConfig,
                                    SpeculativeConfig)
from radixlm.sampling_params import SamplingParams

ENGINE_CONFIGS: tuple[type, ...] = (ModelConfig, CacheConfig, SchedulerConfig, GrammarConfig, SpeculativeConfig)
_FIELD_DEFAULT = object()  # FlagExtra.default: use the field's own default


@dataclass(frozen=True)
class FlagExtra:
    names: tuple[str, ...] = ()  # the flag spellings; () = ("--field-name",)
    choices: tuple[str, ...] | None = None
    help: str | None = None
    default: Any = _FIELD_DEFAULT  # the CLI's default where it differs from the field's


_EXTRAS: dict[str, FlagExtra] = {
    # engine
    "model_path": FlagExtra(help="HF directory or .gguf file (default: SmolLM2-135M-Instruct)"),
    "dtype": FlagExtra(choices=("auto", "float32", "bfloat16", "float16"),
                       help="bfloat16 on a CPU without native bf16 falls back to float32 (docs/engine.md)"),
    "quantization": FlagExtra(choices=("auto", "none", "int8", "int4", "gguf"),
                              help="CPU weights: int8, int4, none, or gguf (a GGUF's own blocks, auto's choice "
                                   "for a GGUF; docs/engine.md)"),
    "num_threads": FlagExtra(help="torch threads on CPU (default: every core; `serve` leaves one core to its IO "
                                  "processes on 3-8 cores, docs/server.md)"),
    "attention_backend": FlagExtra(choices=("auto", "torch", "triton")),
    "seed": FlagExtra(names=("--random-seed",), help="global RNG seed for unseeded sampling"),
    "weight_layout": FlagExtra(choices=("auto", "row", "column", "blocks", "packed", "packed_blocks", "packed_tiles")),
    "tp_size": FlagExtra(help="tensor-parallel ranks (docs/scaling.md)"),
    "nnodes": FlagExtra(help="machines the tp ranks span"),
    "node_rank": FlagExtra(help="this machine (0 runs the server)"),
    "dist_init_addr": FlagExtra(help="host:port of node 0's torch.distributed rendezvous"),
    "max_total_tokens": FlagExtra(help="KV cache capacity in tokens"),
    "logprob_cache_top_k": FlagExtra(help="top-k logprobs kept with each cached prompt token (echo + logprobs "
                                          "requests reuse cached prefixes; asking for more recomputes)"),
    "schedule_policy": FlagExtra(choices=("lpm", "dfs-weight", "fcfs", "lof", "random")),
    "grammar_backend": FlagExtra(choices=("outlines", "xgrammar", "llguidance"),
                                 help="constrained-decoding engine (docs/constrained.md)"),
    "speculative_algorithm": FlagExtra(choices=("NGRAM", "STANDALONE"),
                                       help="speculative decoding (docs/engine.md, 'Speculative decoding')"),
    # server
    "api_keys": FlagExtra(names=("--api-key",),
                          help="require this key (Authorization: Bearer); repeat for several tenants"),
    "admin_api_key": FlagExtra(help="key for the admin debug endpoint"),
    "log_level": FlagExtra(choices=("debug", "info", "warning", "error", "critical")),
    "dp_size": FlagExtra(names=("--dp-size", "--data-parallel-size"),
                         help="data-parallel scheduler processes in this server, one model copy each "
                              "(docs/scaling.md)"),
    "dp_load_balance": FlagExtra(names=("--dp-load-balance", "--load-balance-method"),
                                 choices=("cache_aware", "round_robin"),
                                 help="how --dp-size picks a scheduler for each request"),
    # = radixlm/tools/parsers/registry.CHOICES and server/reasoning.PARSERS (tests/server/tools check it)
    "tool_call_parser": FlagExtra(choices=("auto", "hermes", "qwen25", "qwen", "qwen3", "llama3", "mistral",
                                           "fallback"),
                                  help="tool-call syntax of /v1 tool calling (auto: from the chat template)"),
    "reasoning_parser": FlagExtra(choices=("qwen3", "deepseek-r1"),
                                  help="split <think>...</think> into message.reasoning_content"),
    "max_stored_responses": FlagExtra(help="/v1/responses kept per tenant for GET and previous_response_id "
                                           "(LRU; 0: none)"),
    "max_stored_response_bytes": FlagExtra(help="bytes of stored /v1/responses kept per tenant (LRU)"),
}
_SAMPLING_EXTRAS: dict[str, FlagExtra] = {
    "max_new_tokens": FlagExtra(default=256),
    "temperature": FlagExtra(default=0.0),
    "sampling_seed": FlagExtra(names=("--seed", "--sampling-seed")),
    "logit_bias": FlagExtra(help='a JSON object: {"token id": bias}'),
    "stop": FlagExtra(help="a stop string; repeat for several"),
    "choices": FlagExtra(help="generate exactly one of these strings; repeat for each"),
}


def flag_names(field_name: str, extras: dict[str, FlagExtra] = _EXTRAS) -> tuple[str, ...]:
    extra = extras.get(field_name)
    return extra.names if extra and extra.names else ("--" + field_name.replace("_", "-"),)


def add_dataclass_flags(parser: argparse.ArgumentParser | Any, cls: type,
                        extras: dict[str, FlagExtra] = _EXTRAS, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of `cls` (dest = the field name)."""
    hints = typing.get_type_hints(cls)
    for name, field_default in _fields(cls):
        if name in skip:
            continue
        extra = extras.get(name, FlagExtra())
        default = field_default if extra.default is _FIELD_DEFAULT else extra.default
        kwargs: dict[str, Any] = dict(dest=name, help=extra.help, **_type_kwargs(hints[name], default))
        if extra.choices is not None:
            kwargs["choices"] = extra.choices
        parser.add_argument(*flag_names(name, extras), **kwargs)


def dataclass_values(args: argparse.Namespace, cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The parsed values of cls's flags, as keyword arguments of cls (repeated flags -> tuple/list)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        value = getattr(args, f.name)
        if typing.get_origin(hints[f.name]) is tuple:
            value = tuple(value or ())
        out[f.name] = value
    return out


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    add_dataclass_flags(parser.add_argument_group("sampling (radixlm/sampling_params.py)"), SamplingParams,
                        _SAMPLING_EXTRAS)


def sampling_values(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling_params dict of the request: the flags given (None = SamplingParams' default)."""
    values = {name: getattr(args, name) for name in SamplingParams.__struct_fields__}
    return {k: v for k, v in values.items() if v is not None}


def _fields(cls: type) -> list[tuple[str, Any]]:
    """(name, default) of a config dataclass's or a msgspec Struct's (SamplingParams) fields; a default
    factory (an empty list / dict) is None: "not given" on the command line."""
    if dataclasses.is_dataclass(cls):
        return [(f.name, None if f.default is dataclasses.MISSING else f.default) for f in dataclasses.fields(cls)]
    return [(f.name, None if f.default is msgspec.NODEFAULT else f.default) for f in msgspec.structs.fields(cls)]


def _type_kwargs(hint: Any, default: Any) -> dict[str, Any]:
    """argparse keywords for a field type: bools are switches, lists and tuples repeat, dicts are JSON."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint
    origin = typing.get_origin(base)
    if base is bool:
        return {"action": argparse.BooleanOptionalAction if default else "store_true", "default": default}
    if origin in (list, tuple):
        item = typing.get_args(base)[0]
        return {"action": "append", "type": item, "default": None}
    if origin is dict or base is Any:  # a JSON value (logit_bias, structural_tag)
        return {"type": json.loads, "default": None}
    return {"type": base, "default": default}
