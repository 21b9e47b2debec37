"""ModelRunner: loads the checkpoint, owns the KV pool and the attention backend, runs one forward.

Runs inside the scheduler process. Device, dtype and thread count are decided here, once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from radixlm.runtime.config import CacheConfig, ModelConfig
from radixlm.runtime.forward import ForwardBatch, to_device
from radixlm.runtime.model.contention import ContentionGuard
from radixlm.runtime.model.cpu_ops import apply_cpu_ops, decode_stack, load_cpu_ops
from radixlm.runtime.model.cuda_graph import CudaGraph, DecodeGraphRunner
from radixlm.runtime.model.kv_pool import KVPool
from radixlm.runtime.model.layout_probe import probe_layout
from radixlm.runtime.model.memory import (
    available_bytes, check_kv_fits, check_weights_fit, log_memory, weights_estimate,
)
from radixlm.runtime.model.gguf_loader import gguf_source
from radixlm.runtime.model.gguf_model import load_gguf_blocks
from radixlm.runtime.model.quant.apply import weight_bytes
from radixlm.runtime.model.quant.gguf_blocks import block_bytes
from radixlm.runtime.model.quant.setup import WeightPlan, apply_plan, plan_weights
from radixlm.runtime.model.layers.attention import AttentionBackend, TorchAttentionBackend
from radixlm.runtime.model.registry import build_model
from radixlm.runtime.model.verify_graph import VerifyGraphRunner
from radixlm.runtime.model.weight_layout import apply_weight_layout, resolve_layout

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Without an explicit size the CPU pool never exceeds this many tokens (KV for SmolLM2: ~45 KB/token).
_CPU_MAX_AUTO_TOKENS = 1 << 17


@dataclass(frozen=True)
class RunnerInfo:
    device: str
    dtype: str
    quantization: str  # none | int8 | int4 (model/quant/)
    num_threads: int
    context_len: int
    max_total_tokens: int
    vocab_size: int
    model_dir: str
    architecture: str


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {name!r}")
    return _DTYPES[name]


def default_num_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class StepThreads:
    """Torch intra-op threads per CPU step, by its size.

    With the column weight layout (weight_layout.py: auto's choice for one thread), a single-row GEMV is
    single-threaded in MKL, so a decode step of few requests gains nothing from a second thread, while that
    OpenMP thread, spinning at barriers, takes the core that the thread consuming outputs needs (with
    other processes running it made decode up to 5x slower). Measured with the Engine on 2 cores
    (SmolLM2): batch 1-16 decode ran as fast or faster with 1 thread than with 2. So with that layout
    steps below SMALL_STEP_TOKENS tokens use `small` threads (num_threads - 1 on 2-8 cores) and the rest
    use `full`. The blocks layout multiplies row blocks on every thread, which pays at any size, so
    there small = full, and likewise oneDNN's inner product (the packed layout). Switching costs < 1 us."""

    SMALL_STEP_TOKENS = 32

    def __init__(self, full: int, small: int):
        self.full, self.small = full, small
        self._current = full
        torch.set_num_threads(full)

    @classmethod
    def for_config(cls, mc: ModelConfig, layout: str = "column", measured: int | None = None) -> "StepThreads":
        """layout: the resolved weight layout (weight_layout.resolve_layout); measured: the small-step
        threads layout_probe found fastest (the config's own value still wins)."""
        full = mc.num_threads or default_num_threads()
        if mc.small_step_threads is not None:
            small = mc.small_step_threads
        elif measured is not None:
            small = measured
        else:
            small = full - 1 if 2 <= full <= 8 and layout not in ("blocks", "packed", "packed_blocks",
                                                                         "packed_tiles", "gguf") else full
        if full < 1 or small < 1:
            raise ValueError("num_threads and small_step_threads must be >= 1")
        return cls(full, small)

    @property
    def current(self) -> int:
        return self._current

    def apply(self, num_tokens: int, override: int | None = None) -> None:
        """override: the count a ContentionGuard chose for this step."""
        want = override or (self.small if num_tokens < self.SMALL_STEP_TOKENS else self.full)
        if want != self._current:
            torch.set_num_threads(want)  # the thread running the model; torch's pool is process-wide
            self._current = want


def _probed_layout(hf_config, threads: int) -> tuple[str, int] | None:
    picked = probe_layout(hf_config.hidden_size, hf_config.intermediate_size, hf_config.num_hidden_layers, threads)
    if picked is not None:
        logger.info("weight layout: %s, %d thread(s) for small steps (measured fastest here)", *picked)
    return picked


class ModelRunner:
    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig, model_dir: str, hf_config,
                 max_running_requests: int):
        self.device = resolve_device(model_config.device)
        plan = plan_weights(model_config.quantization, model_config.dtype,
                            resolve_dtype(model_config.dtype, self.device), self.device, model_config.tp_size,
                            gguf_source(model_dir))
        self.dtype, self.quantization = plan.dtype, plan.quantization
        threads = model_config.num_threads or default_num_threads()
        self.layout = resolve_layout(model_config.weight_layout, self.device, self.dtype, threads)
        small = None
        if model_config.tp_size > 1:
            self.layout = "row"  # each rank's shard keeps the loaded layout (not measured under TP)
        elif plan.quantization == "gguf":
            self.layout = "gguf"  # the blocks as the file stores them; their kernels split rows over all threads
        elif model_config.weight_layout == "auto" and self.layout != "row":
            self.layout, small = _probed_layout(hf_config, threads) or (self.layout, None)
            if plan.quantization != "none":
                # The probe timed fp32 weights; the int8 / int4 kernels want every thread at decode too
                # (int8 SmolLM2, 2 threads, batch-1 decode: 52.7 tok/s with 1 thread for small steps, 61-71
                # with 2), so the layout's own rule decides (packed / blocks: all threads).
                small = None
        self.threads = (StepThreads.for_config(model_config, self.layout, small) if self.device.type == "cpu"
                        else None)
        self.context_len = _context_len(hf_config, model_config.context_length)
        t0 = time.perf_counter()
        self.tp = None  # tp_driver.TPDriver when tp_size > 1 (docs/scaling.md)
        if model_config.tp_size > 1:
            from radixlm.runtime.model.tp_driver import TPDriver

            self.tp = TPDriver(model_config, model_dir, hf_config, self.context_len, self.device, self.dtype)
            model = self.tp.model  # this rank's shard; its dims hold this rank's heads
        else:
            if self.device.type == "cpu":
                need = weights_estimate(Path(model_dir), plan.gguf_path, plan.quantization, self.dtype)
                check_weights_fit(need, f"{self.quantization}, {str(self.dtype).removeprefix('torch.')}")
            model = self._load(model_dir, hf_config, plan, threads)
        # Compiled CPU ops (fp32 on the CPU, no TP): fused norms, rotary + K/V store, paged decode attention.
        self.cpu_ops = load_cpu_ops(self.device, self.dtype, self.tp is not None, model_config.attention_backend)
        if self.cpu_ops is not None:
            apply_cpu_ops(model, self.cpu_ops)
            logger.info("compiled CPU ops on (norms, rotary + K/V store, paged decode attention; whole-layer "
                        "one-token decode: %s)", "yes" if model.layers[0].decode_weights is not None else "no")
        self.model = model
        self.dims = model.dims
        logger.info("loaded %s in %.2fs", model_dir, time.perf_counter() - t0)
        if self.tp is None:
            self.max_total_tokens = self._capacity(cache_config, max_running_requests)
        else:
            self.max_total_tokens = self.tp.start(lambda: self._capacity(cache_config, max_running_requests))
        d = self.dims
        kv_bytes = self.max_total_tokens * KVPool.bytes_per_token(d.num_layers, d.num_kv_heads, d.head_dim, self.dtype)
        if self.device.type == "cpu":
            check_kv_fits(kv_bytes, self.max_total_tokens)
        self.kv_pool = KVPool(self.max_total_tokens, d.num_layers, d.num_kv_heads, d.head_dim,
                              self.dtype, self.device)
        if self.device.type == "cpu":
            log_memory(_loaded_bytes(model, plan), kv_bytes, self.max_total_tokens)
        if self.cpu_ops is not None:
            model.decode_stack, model.decode_stack_pool = decode_stack(model, self.cpu_ops, self.kv_pool), self.kv_pool
        # One-token steps through the stack leave the threads when another process holds a core (contention.py).
        self.guard = (ContentionGuard(self.threads.small) if getattr(model, "decode_stack", None) is not None
                      and self.threads is not None and self.threads.small > 1 else None)
        self.backend = self._attention_backend(model_config.attention_backend)
        self.sm_scale = d.sm_scale
        self.graphs: DecodeGraphRunner | None = None  # set by capture_decode_graphs (CUDA only)
        self.verify_graphs: VerifyGraphRunner | None = None  # set by capture_verify_graphs (speculation)
        self.info = RunnerInfo(str(self.device), str(self.dtype).removeprefix("torch."), self.quantization,
                               torch.get_num_threads(),
                               self.context_len, self.max_total_tokens, d.vocab_size, str(model_dir),
                               (getattr(hf_config, "architectures", None) or ["?"])[0])

    def _load(self, model_dir: str, hf_config, plan: WeightPlan, threads: int) -> nn.Module:
        """Build the model and load its weights one tensor at a time into their runtime form."""
        from radixlm.runtime.model.loader import iter_weights

        with torch.device(self.device):
            model = build_model(hf_config, self.context_len)  # parameters are torch.empty: no init cost
        if plan.quantization == "gguf":
            load_gguf_blocks(model, plan.gguf_path, hf_config)
        else:
            for p in model.parameters():  # still unwritten: no memory is touched (rotary buffers stay fp32)
                p.data = torch.empty_like(p, dtype=self.dtype)
            model.load_weights(iter_weights(model_dir))  # each tensor cast into its parameter as it comes
            apply_weight_layout(model, self.layout, threads)
        apply_plan(model, plan, hf_config)  # after the layout: an unquantized part keeps it
        return model

    def _capacity(self, cache: CacheConfig, max_running_requests: int) -> int:
        if cache.max_total_tokens is not None:
            if cache.max_total_tokens < 1:
                raise ValueError("max_total_tokens must be >= 1")
            return int(cache.max_total_tokens)
        d = self.dims
        per_token = KVPool.bytes_per_token(d.num_layers, d.num_kv_heads, d.head_dim, self.dtype)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return max(1, int(free * cache.mem_fraction_static) // per_token)
        tokens = int(available_bytes() * cache.mem_fraction_static) // per_token
        return max(1, min(tokens, _CPU_MAX_AUTO_TOKENS, max_running_requests * self.context_len))

    def _attention_backend(self, name: str) -> AttentionBackend:
        if name == "auto":
            name = "triton" if self.device.type == "cuda" else "torch"
        if name == "torch":
            return TorchAttentionBackend(self.cpu_ops)
        if name == "triton":
            from radixlm.runtime.model.layers.attention_triton import TritonAttentionBackend

            return TritonAttentionBackend()
        raise ValueError(f"attention_backend must be auto, torch or triton; got {name!r}")

    def wants_cuda_graphs(self, model_config: ModelConfig) -> bool:
        return (self.device.type == "cuda" and not model_config.disable_cuda_graph and self.tp is None
                and not isinstance(self.backend, TorchAttentionBackend))  # Triton: capturable decode

    def capture_decode_graphs(self, req_to_token: torch.Tensor, max_bs: int,
                              graph_cls: type = CudaGraph) -> None:
        """Capture the decode forward for batch sizes up to max_bs (needs the request-to-token table,
        which the scheduler owns). With TP the worker ranks would need graphs too: not done yet."""
        t0 = time.perf_counter()
        self.graphs = DecodeGraphRunner(self._run_model, req_to_token, self.sm_scale, max_bs, self.device,
                                        graph_cls)
        logger.info("decode graphs captured in %.2fs", time.perf_counter() - t0)

    def capture_verify_graphs(self, req_to_token: torch.Tensor, max_bs: int, width: int,
                              graph_cls: type = CudaGraph) -> None:
        """Capture speculative verify steps (rows of up to `width` tokens) for batch sizes up to max_bs."""
        t0 = time.perf_counter()
        self.verify_graphs = VerifyGraphRunner(self._run_model, req_to_token, self.sm_scale, max_bs, width,
                                               self.device, graph_cls)
        logger.info("verify graphs captured in %.2fs", time.perf_counter() - t0)

    def _run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, meta, logits_indices: torch.Tensor,
                   argmax_only: bool = False, keep_hidden: bool = False) -> torch.Tensor:
        return self.model(input_ids, positions, self.backend, self.kv_pool, meta, logits_indices, argmax_only,
                          keep_hidden)

    def forward(self, batch: ForwardBatch, logits_indices: torch.Tensor, argmax_only: bool = False,
                keep_hidden: bool = False) -> torch.Tensor:
        """Run the model on the batch's tokens; return fp32 logits [N, V] at logits_indices (argmax_only:
        only each row's argmax is read, see CausalLM.forward). keep_hidden: last_hidden() then returns the
        final hidden states at the same positions (a captured graph keeps none: such a step runs eagerly)."""
        guarded = self.guard is not None and batch.num_tokens == 1 and batch.meta.is_decode
        if self.threads is not None:
            self.threads.apply(batch.num_tokens, self.guard.threads() if guarded else None)
        if (not keep_hidden and self.graphs is not None
                and self.graphs.can_run(batch.meta, batch.input_ids, logits_indices)):
            return self.graphs.replay(batch.input_ids, batch.positions, batch.meta)
        if not keep_hidden and self.verify_graphs is not None and self.verify_graphs.can_run(batch, logits_indices):
            return self.verify_graphs.replay(batch, logits_indices)
        if self.tp is not None:  # the worker ranks run the same step on their shards
            self.tp.send_step(batch, logits_indices)
        t0 = time.perf_counter()
        logits = self._run_model(batch.input_ids, batch.positions, batch.meta, to_device(logits_indices, self.device),
                                 argmax_only, keep_hidden)
        if guarded:
            self.guard.record(self.threads.current, time.perf_counter() - t0)
        return logits

    def last_hidden(self) -> torch.Tensor:
        """The final hidden states [N, hidden] (after the final norm) of the last forward(keep_hidden=True)."""
        hidden = self.model.last_hidden
        assert hidden is not None, "the last forward kept no hidden states"
        return hidden

    def close(self) -> None:
        """Stop the tensor-parallel worker ranks (nothing to do with tp_size == 1)."""
        if self.tp is not None:
            self.tp.close()


def _loaded_bytes(model: nn.Module, plan: WeightPlan) -> int:
    if plan.quantization == "gguf":  # the blocks (a tied head shares the embedding's) and the dense rest
        return block_bytes(model) + sum(p.nbytes for p in model.parameters())
    return weight_bytes(model)


def _context_len(hf_config, requested: int | None) -> int:
    from radixlm.runtime.model.registry import attends_within_window

    model_max = int(getattr(hf_config, "max_position_embeddings", 2048))
    window = getattr(hf_config, "sliding_window", None)
    if window and getattr(hf_config, "use_sliding_window", True) and not attends_within_window(hf_config):
        # This architecture's attention covers the whole context: stay within the window, where it is exact.
        model_max = min(model_max, int(window))
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) == "longrope":
        # transformers switches every position to the long factors once a sequence outgrows the original
        # context (recomputing the whole cache): stay within it, where the short factors are exact.
        original = rope.get("original_max_position_embeddings") or hf_config.original_max_position_embeddings
        model_max = min(model_max, int(original))
    if requested is None:
        return model_max
    if requested < 1:
        raise ValueError("context_length must be >= 1")
    return int(requested)
