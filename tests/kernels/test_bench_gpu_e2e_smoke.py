"""benchmarks/bench_gpu_e2e.py runs end to end in its CPU smoke mode (it is otherwise only run on a lent GPU,
by scripts/gpu_check.sh, so this is what keeps the script from rotting between GPU sessions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, scripts/gpu_check.sh runs the real benchmark")
def test_bench_gpu_e2e_smoke_prints_table():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)  # the smoke mode uses the torch attention backend
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/bench_gpu_e2e.py"), "--device", "cpu", "--smoke"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model ") and "baseline" in line)
    assert "device=cpu" in lines[header - 2] and "transformers=" in lines[header - 2]
    rows = [line.split() for line in lines[header + 1:] if line.strip()]
    assert len(rows) == 4, lines[header:]
    graphs, batch, decode, syncs = rows
    assert syncs[-5:] == ["n/a", "n/a", "n/a", "-", "-"], syncs  # counted on CUDA only
    # no CUDA graphs on CPU: ours, ratio and verdict are n/a; the eager side is still measured
    assert [graphs[-5], graphs[-3], graphs[-1]] == ["n/a", "n/a", "n/a"] and float(graphs[-4]) > 0, graphs
    for row in (batch, decode):  # measured numbers on both sides and a ratio
        ours, base, ratio = float(row[-5]), float(row[-4]), float(row[-3].rstrip("x"))
        assert ours > 0 and base > 0 and ratio == pytest.approx(ours / base, rel=0.05, abs=0.02)
    assert batch[-1] in ("yes", "NO") and decode[-1] == "-"
