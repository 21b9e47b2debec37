"""Frozen configuration dataclasses. Each component takes its own sub-config, never the whole set.

Runs in every process (configs are plain data; the server sends them to children as msgspec/JSON).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    model_path: str | None = None  # None = the default model (SmolLM2-135M-Instruct)
    tokenizer_path: str | None = None  # None = the model directory
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (auto: float32 on CPU, bfloat16 on CUDA)
    device: str = "auto"  # auto | cpu | cuda
    # Weight quantization on the CPU (model/quant/apply.py; SGLang's name): auto | none | int8 | int4 | gguf.
    # auto: a GGUF on the CPU runs from its own blocks (gguf), anything else as quant.apply.DEFAULT_CPU.
    quantization: str = "auto"
    context_length: int | None = None  # None = the model's max_position_embeddings
    num_threads: int | None = None  # torch intra-op threads on CPU; None = number of physical cores
    # Threads for CPU steps of fewer than 32 tokens (small decode batches). With the column weight layout
    # their GEMVs use one thread anyway and a second one only takes the output consumer's core, so
    # None = num_threads - 1 on 2-8 cores there, and num_threads with the blocks layout (model_runner.py).
    small_step_threads: int | None = None
    attention_backend: str = "auto"  # auto (triton on CUDA, torch on CPU) | torch | triton
    seed: int = 0  # global RNG seed for unseeded sampling
    # auto (measured fastest: fp32 CPU -> blocks with >= 2 threads, column with 1) | row | column | blocks
    weight_layout: str = "auto"  # (model/weight_layout.py)
    # Decode steps replay CUDA graphs (model/cuda_graph.py) on CUDA with the Triton backend; SGLang's names.
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None  # None = min(max_running_requests, 128)
    # Tensor parallelism (docs/scaling.md): ranks split heads/MLP/vocab; SGLang's names for multi-node.
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # "host:port" of rank 0's rendezvous; None = 127.0.0.1, a free port


@dataclass(frozen=True)
class CacheConfig:
    max_total_tokens: int | None = None  # KV pool capacity in tokens; None = from mem_fraction_static
    mem_fraction_static: float = 0.25  # share of (free) device memory for the KV pool when no explicit size
    disable_radix_cache: bool = False
    # Top-k alternatives the radix tree keeps beside each cached prompt token's logprob, so echo + logprobs
    # requests reuse cached prefixes (radix_cache/token_logprobs.py); a request asking for more recomputes.
    logprob_cache_top_k: int = 5

    def __post_init__(self) -> None:
        if self.logprob_cache_top_k < 0:
            raise ValueError("logprob_cache_top_k must be >= 0")


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int = 128
    chunked_prefill_size: int = 1024  # per-step budget of prefill tokens (decode tokens come on top)
    schedule_policy: str = "lpm"  # lpm | dfs-weight | fcfs | lof | random
    max_queued_requests: int = 4096  # bounded waiting queue (requests)
    # Admission reserves room for this share of each running request's remaining max_new_tokens,
    # so decode rarely runs out of slots (SGLang's new_token_ratio); retraction handles the rest.
    new_token_ratio: float = 0.4
    enable_mixed_chunk: bool = True  # prefill chunks and decode tokens in one forward


@dataclass(frozen=True)
class GrammarConfig:
    # llguidance | outlines | xgrammar; llguidance by measurement (docs/constrained.md "Choosing the backend")
    grammar_backend: str = "llguidance"
    disable_jump_forward: bool = False
    # Regex for optional whitespace between JSON tokens (None: the backend's default); SGLang's name.
    constrained_json_whitespace_pattern: str | None = None
    grammar_compile_timeout: float = 5.0  # seconds of wall time; the worker is killed past it
    grammar_num_workers: int = 2


DEFAULT_DRAFT_TOKENS = {"NGRAM": 8, "STANDALONE": 4}  # speculative_num_draft_tokens=None (docs/benchmarks.md)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (runtime/speculative/; SGLang's names). Exact: greedy output is token-identical
    and sampled output follows the target distribution (rejection sampling), so it only changes speed."""

    speculative_algorithm: str | None = None  # None (off) | NGRAM | STANDALONE
    speculative_draft_model_path: str | None = None  # STANDALONE: the draft model (same tokenizer)
    # Most tokens proposed (and verified) per request per step; None: 8 for NGRAM (a lookup is free, and the
    # controller shortens drafts at large batch), 4 for STANDALONE (each draft token is a draft forward).
    speculative_num_draft_tokens: int | None = None
    speculative_num_steps: int | None = None  # STANDALONE draft forwards per step; None = num_draft_tokens
    # NGRAM: the longest / shortest suffix (in tokens) looked up in the request's tokens and the cache.
    speculative_ngram_max_match: int = 8
    speculative_ngram_min_match: int = 3
    # Adaptive: a request whose acceptance rate falls below this turns its draft length down, then off.
    speculative_min_acceptance: float = 0.25
    # Most draft tokens verified in one step over the whole batch (None: no cap); the requests whose
    # drafts are accepted most get them first (a batch of verify rows is compute-bound).
    speculative_max_batch_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        algo = self.speculative_algorithm
        if algo is not None and algo.upper() not in ("NGRAM", "STANDALONE"):
            raise ValueError(f"speculative_algorithm must be NGRAM or STANDALONE; got {algo!r}")
        if algo is not None and algo.upper() == "STANDALONE" and not self.speculative_draft_model_path:
            raise ValueError("speculative_algorithm STANDALONE needs speculative_draft_model_path")
        if self.speculative_num_draft_tokens is not None and not 1 <= self.speculative_num_draft_tokens <= 64:
            raise ValueError("speculative_num_draft_tokens must be in [1, 64]")
        if self.speculative_num_steps is not None and self.speculative_num_steps < 1:
            raise ValueError("speculative_num_steps must be >= 1")
        if self.speculative_max_batch_draft_tokens is not None and self.speculative_max_batch_draft_tokens < 1:
            raise ValueError("speculative_max_batch_draft_tokens must be >= 1")
        if not 1 <= self.speculative_ngram_min_match <= self.speculative_ngram_max_match:
            raise ValueError("need 1 <= speculative_ngram_min_match <= speculative_ngram_max_match")

    @property
    def algorithm(self) -> str | None:
        return None if self.speculative_algorithm is None else self.speculative_algorithm.upper()

    @property
    def max_draft(self) -> int:
        """Tokens proposed per step at most (STANDALONE: also bounded by num_steps)."""
        k = self.speculative_num_draft_tokens
        if k is None:
            k = DEFAULT_DRAFT_TOKENS.get(self.algorithm, 4)
        if self.algorithm == "STANDALONE" and self.speculative_num_steps is not None:
            return min(self.speculative_num_steps, k)
        return k


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: Any) -> "EngineConfig":
        """Split flat keyword options (SGLang-style names) into the sub-configs; unknown names raise."""
        groups = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
                  "grammar": GrammarConfig, "speculative": SpeculativeConfig}
        values: dict[str, dict[str, Any]] = {name: {} for name in groups}
        values["model"]["model_path"] = None if model_path is None else str(model_path)
        for key, value in options.items():
            owner = next((g for g, c in groups.items() if key in _field_names(c)), None)
            if owner is None:
                raise TypeError(f"unknown engine option {key!r}")
            values[owner][key] = value
        return cls(**{g: groups[g](**v) for g, v in values.items()})


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server's own settings (the engine's are in EngineConfig); limits from robustness.md."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_keys: tuple[str, ...] = ()  # each key is a tenant (own radix-cache namespace); empty = no auth
    admin_api_key: str | None = None  # unlocks the debug endpoint (and every other route)
    served_model_name: str | None = None  # None = the model directory's name
    enable_metrics: bool = False
    log_level: str = "info"
    max_body_bytes: int = 8 << 20
    max_prompt_chars: int = 1 << 20
    watchdog_timeout: float = 300.0  # seconds without a scheduler heartbeat before the server gives up
    drain_timeout: float = 60.0  # SIGTERM: seconds to finish in-flight work before aborting it
    health_generate_timeout: float = 20.0
    startup_timeout: float = 600.0  # model load (and the default model's one-time download)
    # Data parallelism inside this server (docs/scaling.md): dp_size scheduler processes, each with its
    # own model copy and radix cache; the tokenizer manager picks one per request.
    dp_size: int = 1
    dp_load_balance: str = "cache_aware"  # cache_aware | round_robin
    # /v1 tool calling and reasoning (docs/server.md): the call syntax family (auto: from the chat
    # template) and the thinking-block parser (None: no reasoning separation).
    tool_call_parser: str = "auto"
    reasoning_parser: str | None = None
    # /v1/responses with store (docs/server.md): responses kept for GET and previous_response_id, least
    # recently used dropped first (0: none kept).
    max_stored_responses: int = 1000  # per tenant
    max_stored_response_bytes: int = 256 << 20  # per tenant: the stored responses' JSON

    def __post_init__(self) -> None:
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be at least 1; got {self.dp_size}")
        if self.dp_load_balance not in ("cache_aware", "round_robin"):
            raise ValueError(f"dp_load_balance must be cache_aware or round_robin; got {self.dp_load_balance!r}")


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
