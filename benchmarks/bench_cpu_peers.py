"""radixlm vs HF transformers vs llama.cpp on the CPU: the same model, threads and machine, in one run.

    .venv/bin/python benchmarks/bench_cpu_peers.py [--quick] [--rounds 3] [--threads 2]
        [--modes none,int8,int4] [--llama-python /root/.cache/radixlm-peers/venv/bin/python]
        [--gguf-dir /root/.cache/radixlm-peers/gguf] [--no-hf]

Workloads (issue 18): decode tok/s at batch 1 (an 8-token prompt, 64 new tokens, timed with its prefill);
aggregate tok/s of 32 x 128-token prompts with 64 new tokens each, all submitted at once; prefill tok/s of a
512-token prompt. Greedy, EOS ignored, the same token ids on every side (drawn once here, sent to the
workers as JSON).

Sides, each in its own worker process loaded once (one OpenMP / ggml thread pool per process, as in a
standalone program): radixlm's Engine per `--modes` (quantization none = fp32, int8, int4), HF transformers
fp32 (`generate`, no padding: every prompt of a batch has the same length), and llama.cpp through
llama-cpp-python's low-level API (llama_decode on a multi-sequence batch: how llama-server batches) with the
f32 and q8_0 GGUFs of the same fp32 safetensors. llama-cpp-python is not a dependency: it runs under
`--llama-python` (a separate venv; docs/benchmarks.md says how to build it) and its side is skipped with a
message when that python or the GGUFs are absent.

The machine is shared: each round runs every side of a workload back to back, the table shows medians over
rounds and ratios of medians; the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_info import machine_lines  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_PEERS = Path.home() / ".cache" / "radixlm-peers"
LLAMA_TYPES = ("f32", "q8_0")
_LLAMA_LOG = None


# ---- workloads (token ids only: every side sees the same ids) -----------------------------------------

def sizes(quick: bool) -> dict:
    if quick:
        return {"new": 16, "nreq": 8, "plen": 64, "prefill": 128}
    return {"new": 64, "nreq": 32, "plen": 128, "prefill": 512}


def make_workloads(model_dir: str, quick: bool) -> dict:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]

    def ids(n: int, seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return [vocab[int(i)] for i in torch.randint(len(vocab), (n,), generator=g)]

    s = sizes(quick)
    return {"sizes": s, "one": ids(8, 0), "batch": [ids(s["plen"], 1 + i) for i in range(s["nreq"])],
            "long": ids(s["prefill"], 99), "vocab_size": len(tok)}


def row_names(s: dict) -> list[str]:
    return [f"decode tok/s, batch 1 ({s['new']} new)",
            f"aggregate tok/s, {s['nreq']} x {s['plen']} prompt, {s['new']} new",
            f"prefill tok/s, {s['prefill']}-token prompt"]


# ---- the radixlm and HF workers (run under this venv's python) --------------------------------------

def radixlm_runs(mode: str, model_dir: str, threads: int, w: dict) -> tuple[list, str]:
    from radixlm.runtime.engine import Engine

    s = w["sizes"]
    engine = Engine(model_dir, num_threads=threads, quantization=mode, max_total_tokens=s["nreq"] * 400 + 2048,
                    chunked_prefill_size=2048)
    params = {"temperature": 0, "ignore_eos": True}

    def decode() -> float:
        engine.generate(input_ids=w["one"], sampling_params={**params, "max_new_tokens": 4})  # warm-up
        engine.flush_cache()
        t = time.perf_counter()
        engine.generate(input_ids=w["one"], sampling_params={**params, "max_new_tokens": s["new"]})
        return s["new"] / (time.perf_counter() - t)

    def batch() -> float:
        engine.flush_cache()
        t = time.perf_counter()
        engine.generate(input_ids=w["batch"], sampling_params={**params, "max_new_tokens": s["new"]})
        return len(w["batch"]) * s["new"] / (time.perf_counter() - t)

    def prefill() -> float:
        engine.flush_cache()
        engine.generate(input_ids=w["long"][:16], sampling_params={"max_new_tokens": 0})
        engine.flush_cache()
        t = time.perf_counter()
        engine.generate(input_ids=w["long"], sampling_params={"max_new_tokens": 0})
        return len(w["long"]) / (time.perf_counter() - t)

    return [decode, batch, prefill], engine.runner.layout


def hf_runs(model_dir: str, threads: int, w: dict) -> list:
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    s = w["sizes"]
    pad = model.generation_config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad

    def gen(ids: list[list[int]], new: int) -> float:
        x = torch.tensor(ids)
        t = time.perf_counter()
        model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=pad)
        return len(ids) * new / (time.perf_counter() - t)

    def prefill() -> float:
        x = torch.tensor([w["long"]])
        with torch.inference_mode():
            model(x[:, :16])
            t = time.perf_counter()
            model(x)
        return len(w["long"]) / (time.perf_counter() - t)

    gen([w["one"]], 4)  # warm-up
    return [lambda: gen([w["one"]], s["new"]), lambda: gen(w["batch"], s["new"]), prefill]


# ---- the llama.cpp worker (runs under --llama-python; imports nothing from radixlm or torch) -----------

def llama_runs(gguf: str, threads: int, w: dict) -> list:
    import ctypes

    import llama_cpp as L
    import numpy as np

    s = w["sizes"]
    global _LLAMA_LOG  # the C side keeps the callback: it must outlive this function
    _LLAMA_LOG = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(_LLAMA_LOG, ctypes.c_void_p(0))
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0
    # ggml's AMX repacking of q8_0 weights (CPUs with AMX) crashed llama_decode on any batch of >= 2 tokens
    # in this build (0.3.36); without the extra buffer types q8_0 runs ggml's AVX512 / VNNI dot products.
    # f32 has no repacked form, so the flag changes nothing there.
    mparams.use_extra_bufts = not gguf.endswith("q8_0.gguf")
    model = L.llama_model_load_from_file(gguf.encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cparams = L.llama_context_default_params()
    nseq = max(1, s["nreq"])
    cparams.n_ctx = nseq * max(s["plen"] + s["new"] + 16, s["prefill"] + 64)  # per stream: see kv_unified
    cparams.n_batch = 2048  # llama-server's default: prompts are decoded in chunks of up to 2048 tokens
    cparams.n_seq_max = nseq
    cparams.n_threads = cparams.n_threads_batch = threads
    # One KV stream per sequence (n_ctx / n_seq_max cells each): each sequence attends to its own cells.
    # A unified cache (kv_unified=True) makes every sequence's attention span all sequences' cells.
    cparams.kv_unified = os.environ.get("RADIXLM_BENCH_LLAMA_KV_UNIFIED") == "1"
    cparams.no_perf = True
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    batch = L.llama_batch_init(cparams.n_batch, 0, nseq)

    def submit(items: list[tuple[int, int, int, bool]]) -> None:
        """items: (token, pos, seq, wants logits), at most n_batch of them."""
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, int(logits)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(i: int) -> int:
        ptr = L.llama_get_logits_ith(ctx, i)
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (n_vocab,)).argmax())

    def clear() -> None:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)

    def generate(prompts: list[list[int]], new: int) -> None:
        """Greedy, all sequences at once: the prompts in chunks of n_batch tokens, then one token per
        sequence per llama_decode, as llama-server's slots run."""
        clear()
        items = [(t, p, q, p == len(ids) - 1) for q, ids in enumerate(prompts) for p, t in enumerate(ids)]
        nxt: list[int] = []
        for start in range(0, len(items), cparams.n_batch):
            chunk = items[start: start + cparams.n_batch]
            submit(chunk)
            nxt += [argmax(i) for i, it in enumerate(chunk) if it[3]]
        for step in range(new - 1):
            submit([(nxt[q], len(ids) + step, q, True) for q, ids in enumerate(prompts)])
            nxt = [argmax(q) for q in range(len(prompts))]

    def gen_tps(prompts: list[list[int]]) -> float:
        t = time.perf_counter()
        generate(prompts, s["new"])
        return len(prompts) * s["new"] / (time.perf_counter() - t)

    def prefill() -> float:
        clear()
        items = [(t, p, 0, p == len(w["long"]) - 1) for p, t in enumerate(w["long"])]
        t0 = time.perf_counter()
        submit(items)
        argmax(len(items) - 1)
        return len(items) / (time.perf_counter() - t0)

    generate([w["one"]], 4)  # warm-up
    return [lambda: gen_tps([w["one"]]), lambda: gen_tps(w["batch"]), prefill]


def llama_version() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}; {llama_cpp.llama_print_system_info().decode().strip()}"


def serve(side: str, args: argparse.Namespace) -> None:
    """Worker: load once, print "ready <version>", then answer each stdin line (a workload index) with tok/s."""
    w = json.loads(Path(args.workloads).read_text())
    kind, _, variant = side.partition(":")
    if kind == "radixlm":
        import radixlm
        import torch

        runs, layout = radixlm_runs(variant, args.model_path, args.threads, w)
        version = f"radixlm {radixlm.__version__}, torch {torch.__version__}, weight layout {layout}"
    elif kind == "hf":
        import torch
        import transformers

        runs, version = hf_runs(args.model_path, args.threads, w), \
            f"transformers {transformers.__version__}, torch {torch.__version__}"
    else:
        runs, version = llama_runs(variant, args.threads, w), llama_version()
    print("ready " + version.replace("\n", " "), flush=True)
    for line in sys.stdin:
        print(json.dumps(runs[int(line)]()), flush=True)


class Worker:
    def __init__(self, name: str, python: str, side: str, args: argparse.Namespace, workloads: str,
                 tree: str | None = None):
        """tree: run radixlm from this checkout (PYTHONPATH) instead of the importing one (--baseline-tree)."""
        self.name = name
        cmd = [python, str(Path(__file__).resolve()), "--side", side, "--workloads", workloads,
               "--model-path", args.model_path, "--threads", str(args.threads)]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        if tree is not None:
            env["PYTHONPATH"] = tree
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("ready"):
            raise RuntimeError(f"the {name} worker did not start")
        self.version = line.removeprefix("ready ").strip()

    def run(self, index: int) -> float:
        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def llama_sides(args: argparse.Namespace) -> tuple[list[tuple[str, str, str]], str | None]:
    """(name, python, side) for llama.cpp, or a reason it is skipped."""
    py = args.llama_python
    if not py or not Path(py).exists():
        return [], f"llama.cpp skipped: no python at {py} (docs/benchmarks.md: building llama-cpp-python)"
    probe = subprocess.run([py, "-c", "import llama_cpp, numpy"], capture_output=True, text=True)
    if probe.returncode != 0:
        return [], f"llama.cpp skipped: {py} cannot import llama_cpp ({probe.stderr.strip().splitlines()[-1:]})"
    sides, missing = [], []
    for t in LLAMA_TYPES:
        path = Path(args.gguf_dir) / f"{Path(args.model_path).name}-{t}.gguf"
        if path.exists():
            sides.append((f"llama.cpp {t}", py, f"llama:{path}"))
        else:
            missing.append(str(path))
    return sides, (f"llama.cpp GGUFs missing: {missing}" if missing else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small workloads (a smoke run)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per workload (medians shown)")
    ap.add_argument("--modes", default="none,int8", help="radixlm quantization modes, comma-separated")
    ap.add_argument("--no-hf", action="store_true", help="leave HF transformers out")
    ap.add_argument("--baseline-tree", default=None,
                    help="another radixlm checkout (e.g. the main branch) whose --modes run as extra sides "
                         "'base <mode>': before/after ratios from one run")
    ap.add_argument("--only", default="0,1,2", help="workload rows to run (0 decode, 1 batch, 2 prefill)")
    ap.add_argument("--llama-python", default=str(DEFAULT_PEERS / "venv" / "bin" / "python"))
    ap.add_argument("--gguf-dir", default=str(DEFAULT_PEERS / "gguf"),
                    help="holds <model dir name>-f32.gguf and -q8_0.gguf (convert_hf_to_gguf.py)")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)  # internal: a worker process
    ap.add_argument("--workloads", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side is not None:
        serve(args.side, args)
        return
    from radixlm.runtime.model.loader import resolve_model_path

    args.model_path = str(resolve_model_path(args.model_path))
    w = make_workloads(args.model_path, args.quick)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(w, f)
    modes = [m for m in args.modes.split(",") if m]
    plans = [(f"radixlm {m}", sys.executable, f"radixlm:{m}", None) for m in modes]
    if args.baseline_tree:
        plans += [(f"base {m}", sys.executable, f"radixlm:{m}", args.baseline_tree) for m in modes]
    if not args.no_hf:
        plans.append(("HF", sys.executable, "hf", None))
    lsides, note = llama_sides(args)
    plans += [(*side, None) for side in lsides]
    start_load = load()
    workers = [Worker(name, py, side, args, f.name, tree) for name, py, side, tree in plans]
    names = row_names(w["sizes"])
    got = {wk.name: [[] for _ in names] for wk in workers}
    chosen = [int(i) for i in args.only.split(",")]
    for index in chosen:
        for r in range(args.rounds):
            # Every other round in reverse: a side that runs right after another one's threads stop spinning
            # measured ~13% slower (docs/benchmarks.md, session 26), so no side always comes first.
            for wk in (workers if r % 2 == 0 else workers[::-1]):
                got[wk.name][index].append(wk.run(index))
        print(f"# {names[index]}: " + ", ".join(f"{n} {statistics.median(v[index]):.1f}" for n, v in got.items())
              + f" | load {load()}", flush=True)  # progress (the table comes at the end)
    for wk in workers:
        wk.close()
    os.unlink(f.name)
    print()
    for line in machine_lines():
        print(line)
    for wk in workers:
        print(f"{wk.name}: {wk.version}")
    if note:
        print(note)
    print(f"model {Path(args.model_path).name} | threads {args.threads} | median of {args.rounds} rounds | "
          f"load average {start_load} (start), {load()} (end)")
    med = {n: [statistics.median(v) if v else float("nan") for v in rows] for n, rows in got.items()}
    cols = list(med)
    print("| workload | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for i, name in enumerate(names):
        if i in chosen:
            print(f"| {name} | " + " | ".join(f"{med[c][i]:.1f}" for c in cols) + " |")
    refs = [c for c in cols if c.startswith(("llama.cpp", "HF", "base"))]
    ours = [c for c in cols if c.startswith("radixlm")]
    if refs and ours:
        print("\nratios (radixlm / peer, medians):")
        # a baseline side is compared with the same mode only (radixlm int8 / base int8)
        pairs = [(o, r) for o in ours for r in refs if not r.startswith("base") or r[4:] == o[7:]]
        print("| workload | " + " | ".join(f"{o} / {r}" for o, r in pairs) + " |")
        print("|---|" + "---|" * len(pairs))
        for i, name in enumerate(names):
            if i in chosen:
                print(f"| {name} | " + " | ".join(f"{med[o][i] / med[r][i]:.2f}x" for o, r in pairs) + " |")


if __name__ == "__main__":
    main()
