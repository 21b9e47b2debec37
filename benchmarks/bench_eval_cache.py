"""An eval harness on the radix cache: lm-evaluation-harness, 5-shot multiple choice through `local-completions`
(echo + logprobs requests, the server's tokenizer routes), against a server with the radix cache and one with
--disable-radix-cache, each in its own process, one after the other.

    .venv/bin/python benchmarks/bench_eval_cache.py [--docs 40] [--model-path DIR] [--threads N]

Prints each side's wall time for the evaluation (server start excluded), the radix-cache hit rate the server
reports for it (cached / prompt tokens), the wall-time ratio (cache off / cache on) and the largest difference
between the two sides' loglikelihoods (lm-eval sums the continuation tokens' logprobs; after a cache hit those
run the short-extend attention over the cached KV, which rounds differently from a whole prefill: ~1e-5 a
token, as every cache hit; engine.md, "Logprobs"). The task is written to a temporary directory: arithmetic
questions with four numeric choices after a fixed description and five fixed examples (lm-eval's `first_n`
few-shot sampler), so every request shares a ~300-token prefix, as MMLU-style 5-shot prompts do.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TASK = "radixlm_bench_mc"
DESCRIPTION = ("The following are multiple choice questions about elementary arithmetic. Each question asks for the "
               "sum of two whole numbers. Read the question, add the two numbers carefully, and answer with the one "
               "choice that is the correct sum. Only one of the four choices is correct; the others are close to it "
               "so that a guess is unlikely to be right. ") * 3
YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    train: {dir}/train.jsonl
    test: {dir}/test.jsonl
output_type: multiple_choice
training_split: train
fewshot_split: train
test_split: test
num_fewshot: 5
fewshot_config:
  sampler: first_n
description: "{description}\\n\\n"
doc_to_text: "Question: What is {{{{a}}}} plus {{{{b}}}}?\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def question(rng: random.Random) -> dict:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    wrong = rng.sample([d for d in range(-12, 13) if d], 3)
    choices = [str(a + b + d) for d in [0] + wrong]
    rng.shuffle(choices)
    return {"a": a, "b": b, "choices": [" " + c for c in choices], "answer": choices.index(str(a + b))}


def write_task(root: Path, docs: int) -> None:
    rng = random.Random(0)
    for name, count in (("train", 5), ("test", docs)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(question(rng)) + "\n" for _ in range(count)))
    (root / f"{TASK}.yaml").write_text(YAML.format(task=TASK, dir=root, description=DESCRIPTION))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`python -m radixlm.launch_server` in its own process, until stop()."""

    def __init__(self, model_path: str | None, threads: int | None, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "radixlm.launch_server", "--port", str(self.port), "--log-level", "warning",
                "--served-model-name", "bench", *extra]
        if model_path:
            args += ["--model-path", model_path]
        if threads:
            args += ["--num-threads", str(threads)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the server did not start: {' '.join(args)}")

    def cache_stats(self) -> dict:
        return httpx.get(self.url + "/server_info", timeout=30).json()["cache_stats"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_side(name: str, extra: list[str], args: argparse.Namespace, task_manager) -> dict:
    import lm_eval
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    server = Server(args.model_path, args.threads, *extra)
    try:
        lm = LocalCompletionsAPI(model="bench", base_url=server.url + "/v1/completions", max_length=4096)
        assert lm.tokenizer_backend == "remote", "local-completions did not detect the server's tokenizer"
        before = server.cache_stats()
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=task_manager, log_samples=True)
        wall = time.perf_counter() - start
        after = server.cache_stats()
    finally:
        server.stop()
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    return {"name": name, "wall": wall, "hit_rate": (after["cached_tokens"] - before["cached_tokens"]) / prompt,
            "prompt_tokens": prompt, "acc": out["results"][TASK]["acc,none"],
            "lls": [ll for s in samples for ll, _ in s["filtered_resps"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=40, help="questions (4 loglikelihood requests each)")
    parser.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--threads", type=int, default=None, help="the servers' --num-threads")
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # local-completions sends a bearer token; no key is set
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="bench-eval-cache-") as tmp:
        write_task(Path(tmp), args.docs)
        tasks = TaskManager(include_path=tmp, include_defaults=False)
        on = run_side("radix cache", [], args, tasks)
        off = run_side("--disable-radix-cache", ["--disable-radix-cache"], args, tasks)
    print(f"lm-eval {TASK}: {args.docs} questions, 5-shot, {len(on['lls'])} loglikelihood requests, "
          f"{on['prompt_tokens']} prompt tokens")
    print(f"{'server':<24}{'wall s':>9}{'hit rate':>10}{'acc':>8}")
    for side in (on, off):
        print(f"{side['name']:<24}{side['wall']:>9.1f}{side['hit_rate']:>10.1%}{side['acc']:>8.3f}")
    print(f"wall-time ratio (off / on): {off['wall'] / on['wall']:.2f}x")
    print(f"max |delta loglikelihood|: {max(abs(a - b) for a, b in zip(on['lls'], off['lls'], strict=True)):.2e}")


if __name__ == "__main__":
    main()
