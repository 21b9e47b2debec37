"""End-to-end GPU check (issue 7 item 4): radixlm's Engine on CUDA in bf16 against itself without CUDA
graphs and against HF transformers `generate`, on SmolLM2-135M and on a random-weight ~1B Llama.

    python benchmarks/bench_gpu_e2e.py [--model-path DIR] [--quick]      # on a GPU (scripts/gpu_check.sh)
    python benchmarks/bench_gpu_e2e.py --device cpu --smoke               # tiny model on CPU (tests)

Rows per model (the table is printed last, with the GPU name and torch/triton/transformers versions):
  * decode step at batch 1, CUDA graphs vs eager: the same Engine with its graph runner switched off
    (what disable_cuda_graph=True runs); target: graphs cut the step time by at least half (>= 2x);
  * throughput at batch 64 (64 prompts x 128 tokens, 128 new, ignore_eos) vs HF `generate` on the same
    GPU and dtype; target >= 10x;
  * decode tok/s at batch 1 vs HF `generate` (no target).
A decode step time is (T(n new tokens) - T(1 new token)) / (n - 1): prefill and request overhead cancel.

No internet on the GPU machine: the default model is used only if it is already cached (or given with
--model-path); otherwise a random-weight model with SmolLM2's config stands in (same shapes, so the same
speed). The 1B Llama always has random weights. Prompts are random token ids (no tokenizer involved).
`--smoke` runs a tiny random Llama for a few tokens (torch attention backend on CPU; graphs are "n/a"),
so that the script itself can be tested anywhere.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# SmolLM2-135M-Instruct's shapes (its config.json); random weights stand in when it is not cached.
SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
               max_position_embeddings=8192)
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False, rope_theta=500000.0,
                max_position_embeddings=4096)
GRAPH_TARGET = 2.0  # eager step / graph step: "graphs cut batch-1 step time by at least half"
THROUGHPUT_TARGET = 10.0  # radixlm / HF generate at batch 64


@dataclass(frozen=True)
class Workload:
    batch: int
    prompt_len: int
    new_tokens: int  # batch run
    decode_new: int  # batch-1 decode runs
    repeats: int  # timed runs per measurement (the fastest counts)


@dataclass
class Row:
    model: str
    metric: str
    ours: float
    base: float
    ratio: float
    target: float | None

    @property
    def met(self) -> str:
        if self.target is None:
            return "-"
        if self.ratio != self.ratio:  # NaN: not measurable here (no graphs on CPU)
            return "n/a"
        return "yes" if self.ratio >= self.target else "NO"


# ---- models ---------------------------------------------------------------------------------------
def write_random_llama(out_dir: Path, shapes: dict, device: torch.device, dtype: torch.dtype):
    """A random-weight Llama (HF init, built on `device` so that 1B parameters take a second) saved as a
    safetensors HF directory with a small tokenizer; returns the HF model, kept for the baseline."""
    import transformers

    from radixlm.testing import build_tokenizer

    tok = build_tokenizer(out_dir)
    config = transformers.LlamaConfig(rms_norm_eps=1e-5, bos_token_id=tok.bos_token_id,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **shapes)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    model = model.to(dtype).eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return model


def cached_default_model() -> Path | None:
    """The default model's directory if it is already converted locally (never downloads)."""
    try:
        from radixlm.runtime.model.default_model import DEFAULT_MODEL_NAME
        from radixlm.runtime.model.loader import cache_root

        path = cache_root() / "models" / DEFAULT_MODEL_NAME
    except ImportError:  # platformdirs missing: no cache to look in
        return None
    return path if (path / "config.json").is_file() else None


def load_hf(model_dir: Path, device: torch.device, dtype: torch.dtype):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()


# ---- timing ---------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn, repeats: int, device: torch.device) -> float:
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def step_time(run, new: int, repeats: int, device: torch.device) -> float:
    """Seconds per decode step: (T(new) - T(1)) / (new - 1), each the fastest of `repeats` runs."""
    t1 = best_time(lambda: run(1), repeats, device)
    tn = best_time(lambda: run(new), repeats, device)
    return max(tn - t1, 1e-9) / (new - 1)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, vocab, (n, length), generator=g).tolist()  # low ids: the tokenizer's specials


def count_syncs(fn) -> list[str]:
    """Run fn with torch's CUDA sync debug mode on; the caller location of every host-device sync it made
    (in any thread: the Engine runs its steps in a background thread)."""
    import warnings

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


def syncs_per_step(decode, steps: int = 8) -> float:
    """Host syncs per batch-1 decode step: the difference between runs of 1 and 1 + steps new tokens;
    prints where they come from."""
    from collections import Counter

    base, more = Counter(count_syncs(lambda: decode(1))), Counter(count_syncs(lambda: decode(1 + steps)))
    extra = more - base
    print(f"  host syncs in {steps} decode steps: " + (", ".join(f"{k} x{v}" for k, v in extra.most_common())
                                                      or "none"), flush=True)
    return (sum(more.values()) - sum(base.values())) / steps


# ---- radixlm ---------------------------------------------------------------------------------------
def run_ours(model_dir: Path, device: torch.device, dtype: str, w: Workload, vocab: int) -> dict[str, float]:
    from radixlm.runtime.engine import Engine

    options = dict(device=device.type, dtype=dtype, max_running_requests=w.batch, cuda_graph_max_bs=w.batch,
                   disable_radix_cache=True,  # every timed run recomputes its prompt, as HF does
                   context_length=w.prompt_len + max(w.new_tokens, w.decode_new) + 8,
                   max_total_tokens=w.batch * (w.prompt_len + w.new_tokens + 8) + 64)
    if device.type == "cpu":
        options.update(attention_backend="torch", num_threads=1)
    engine = Engine(str(model_dir), **options)
    try:
        prompts = random_prompts(w.batch, w.prompt_len, vocab, seed=1)
        one = prompts[0]

        def gen(ids, new: int) -> None:
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": new, "temperature": 0,
                                                            "ignore_eos": True})

        gen(prompts, 4)  # warm-up: Triton compiles the extend/decode kernels for these shapes
        gen(one, 4)
        graphs = engine.runner.graphs
        out = {"graph_step": float("nan"), "eager_step": float("nan")}
        decode = lambda n: gen(one, n)  # noqa: E731
        if graphs is not None:
            out["graph_step"] = step_time(decode, w.decode_new, w.repeats, device)
            engine.runner.graphs = None  # the eager path, exactly what disable_cuda_graph=True runs
            try:
                out["eager_step"] = step_time(decode, w.decode_new, w.repeats, device)
            finally:
                engine.runner.graphs = graphs
        else:
            out["eager_step"] = step_time(decode, w.decode_new, w.repeats, device)
        out["decode_step"] = out["graph_step"] if graphs is not None else out["eager_step"]
        out["syncs"] = float("nan")
        if device.type == "cuda":
            try:  # an audit: never let it cost the timed rows
                out["syncs"] = syncs_per_step(decode)
            except Exception as e:  # noqa: BLE001
                print(f"  sync count failed: {e!r}", flush=True)
        out["batch_s"] = best_time(lambda: gen(prompts, w.new_tokens), w.repeats, device)
        out["graphs"] = graphs is not None
        return out
    finally:
        engine.shutdown()


# ---- HF transformers -----------------------------------------------------------------------------
def run_hf(model, device: torch.device, w: Workload, vocab: int) -> dict[str, float]:
    prompts = torch.tensor(random_prompts(w.batch, w.prompt_len, vocab, seed=1), device=device)
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else model.config.eos_token_id

    def gen(ids: torch.Tensor, new: int) -> None:
        with torch.inference_mode():  # equal-length prompts: no padding, the same arithmetic as ours
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=pad)

    gen(prompts, 2)  # warm-up (cuBLAS handles, allocator)
    one = prompts[:1]
    return {"decode_step": step_time(lambda n: gen(one, n), w.decode_new, w.repeats, device),
            "batch_s": best_time(lambda: gen(prompts, w.new_tokens), w.repeats, device)}


# ---- one model --------------------------------------------------------------------------------------
def bench_model(name: str, model_dir: Path, hf_model, device: torch.device, dtype: torch.dtype, w: Workload,
                skip_hf: bool) -> list[Row]:
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    dtype_name = str(dtype).removeprefix("torch.")
    print(f"[{name}] radixlm Engine ({model_dir})", flush=True)
    ours = run_ours(model_dir, device, dtype_name, w, vocab)
    gc.collect()
    hf = {"decode_step": float("nan"), "batch_s": float("nan")}
    if not skip_hf:
        print(f"[{name}] HF generate", flush=True)
        hf = run_hf(hf_model if hf_model is not None else load_hf(model_dir, device, dtype), device, w, vocab)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    b = w.batch * w.new_tokens
    ours_tps, hf_tps = b / ours["batch_s"], b / hf["batch_s"]
    g, e = 1 / ours["graph_step"], 1 / ours["eager_step"]
    d, hd = 1 / ours["decode_step"], 1 / hf["decode_step"]
    return [
        Row(name, "decode tok/s b=1: graphs vs eager", g, e, g / e, GRAPH_TARGET),
        Row(name, f"tok/s b={w.batch} ({w.prompt_len}+{w.new_tokens}) vs HF", ours_tps, hf_tps, ours_tps / hf_tps,
            THROUGHPUT_TARGET),
        Row(name, "decode tok/s b=1 vs HF", d, hd, d / hd, None),
        # 1 is the floor (reading the sampled tokens); the rest are listed above the table
        Row(name, "host syncs per decode step b=1", ours["syncs"], float("nan"), float("nan"), None),
    ]


def models(opts, device: torch.device, dtype: torch.dtype, work: Path):
    """Yield (name, model dir, HF model or None) one at a time, so only one HF model is alive at once."""
    if opts.smoke:
        from radixlm.testing import build_tiny_model

        yield "tiny-llama (random)", build_tiny_model(work / "tiny"), None
        return
    if opts.model_path:
        yield Path(opts.model_path).name, Path(opts.model_path), None
    elif (cached := cached_default_model()) is not None:
        yield "SmolLM2-135M", cached, None
    else:
        print("default model not cached: random weights with SmolLM2-135M's config", flush=True)
        out = work / "smollm2-random"
        yield "SmolLM2-135M (random)", out, write_random_llama(out, SMOLLM2, device, dtype)
    out = work / "llama-1b-random"
    yield "Llama-1B (random)", out, write_random_llama(out, LLAMA_1B, device, dtype)


# ---- report -----------------------------------------------------------------------------------------
def print_table(rows: list[Row], device: torch.device, dtype: torch.dtype) -> None:
    import transformers

    try:
        triton = importlib.import_module("triton").__version__
    except Exception:  # noqa: BLE001 (missing, or half-imported when the budget alarm hit its import)
        triton = "none"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\nend-to-end: device={gpu} dtype={str(dtype).removeprefix('torch.')} torch={torch.__version__} "
          f"triton={triton} transformers={transformers.__version__}")
    print("ratio = ours / baseline (tok/s); graphs row: baseline = the same engine without CUDA graphs")
    print(f"{'model':<24} {'metric':<38} {'ours':>10} {'baseline':>10} {'ratio':>8} {'target':>7} {'met':>4}")
    for r in rows:
        fmt = lambda x: "n/a" if x != x else f"{x:.1f}"  # noqa: E731
        ratio = "n/a" if r.ratio != r.ratio else f"{r.ratio:.2f}x"
        target = "-" if r.target is None else f">={r.target:g}x"
        print(f"{r.model:<24} {r.metric:<38} {fmt(r.ours):>10} {fmt(r.base):>10} {ratio:>8} {target:>7} {r.met:>4}")


def workload(opts) -> Workload:
    if opts.smoke:
        return Workload(batch=4, prompt_len=8, new_tokens=4, decode_new=4, repeats=1)
    if opts.quick:
        return Workload(batch=64, prompt_len=128, new_tokens=64, decode_new=32, repeats=1)
    return Workload(batch=64, prompt_len=128, new_tokens=128, decode_new=64, repeats=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help="tiny random model, a few tokens (CPU tests)")
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    parser.add_argument("--model-path", default=None, help="SmolLM2 (or any HF Llama-family) directory")
    parser.add_argument("--skip-hf", action="store_true", help="no HF baseline (ratios vs HF are n/a)")
    parser.add_argument("--budget", type=int, default=0,
                        help="seconds: then stop and print the table of the models measured so far")
    opts = parser.parse_args()
    device = torch.device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --smoke", file=sys.stderr)
        return 2
    if device.type == "cpu" and not opts.smoke:
        print("on CPU only --smoke is supported (see benchmarks/bench_engine.py for CPU numbers)", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:  # radixlm's own dependencies (msgspec, ...) may be missing on a lent GPU machine
        importlib.import_module("radixlm.runtime.engine")
    except ImportError as e:
        print(f"cannot import the radixlm Engine ({e}): install the missing package (scripts/gpu_check.sh "
              "installs wheels carried in .whl/)", file=sys.stderr)
        return 3
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    w = workload(opts)
    rows: list[Row] = []
    failed = False
    t0 = time.perf_counter()
    if opts.budget:  # stop measuring in time to print the table before an outer `timeout` kills us
        signal.signal(signal.SIGALRM, _over_budget)
        signal.alarm(opts.budget)
    name = "-"
    try:
        with tempfile.TemporaryDirectory(prefix="radixlm-e2e-") as tmp:
            for name, model_dir, hf_model in models(opts, device, dtype, Path(tmp)):
                t = time.perf_counter()
                try:
                    rows += bench_model(name, model_dir, hf_model, device, dtype, w, opts.skip_hf)
                except Exception:  # report it and go on: the other model's rows and the table still print
                    traceback.print_exc()
                    failed = True
                    rows.append(Row(name, "FAILED (traceback above)", *[float("nan")] * 3, None))
                print(f"[{name}] {time.perf_counter() - t:.0f} s", flush=True)
                del hf_model
                gc.collect()
    except OverBudget:
        failed = True
        rows.append(Row(name, f"STOPPED: over --budget {opts.budget} s", *[float("nan")] * 3, None))
    except Exception:  # building a model failed (or the budget alarm hit an import, which re-raises it)
        traceback.print_exc()
        failed = True
        rows.append(Row(name, "FAILED (traceback above)", *[float("nan")] * 3, None))
    finally:
        signal.alarm(0)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    print_table(rows, device, dtype)
    return 1 if failed else 0


class OverBudget(BaseException):  # not an Exception: the per-model handler must not swallow it
    pass


def _over_budget(signum, frame) -> None:
    raise OverBudget()


if __name__ == "__main__":
    sys.exit(main())
