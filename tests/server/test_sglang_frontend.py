"""The stock SGLang frontend (sglang==0.5.2, in a separate venv without torch) drives our server unchanged.

scripts/setup.sh creates that venv in .venv/sglang-frontend (RADIXLM_SGLANG_PYTHON may name another
python): `pip install sglang==0.5.2 pybase64 pydantic` (its frontend imports pybase64 and pydantic without
declaring them). Skipped when absent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import TENANT_KEYS

REPO = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = Path(os.environ.get("RADIXLM_SGLANG_PYTHON", REPO / ".venv/sglang-frontend/bin/python"))

pytestmark = pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason="no venv with the stock sglang frontend")


def native_text(client, text: str, max_new_tokens: int) -> str:
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    return client.post("/generate", json=body).json()["text"]


def expected_choice(client, prefix: str, choices: list[str]) -> str:
    """The stock frontend's default rule (token-length-normalized prompt logprob) from our native API."""
    start = client.post("/generate", json={"text": prefix, "sampling_params": {"max_new_tokens": 0}}).json()[
        "meta_info"]["prompt_tokens"] - 2
    body = {"text": [prefix + c for c in choices], "return_logprob": True, "logprob_start_len": start,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0}}
    scores = []
    for res in client.post("/generate", json=body).json():
        values = [e[0] for e in res["meta_info"]["input_token_logprobs"] if e[0] is not None]
        scores.append(sum(values) / len(values))
    return choices[scores.index(max(scores))]


def test_stock_sglang_programs(server, client):
    script = Path(__file__).with_name("sglang_programs.py")
    proc = subprocess.run([str(SGLANG_PYTHON), str(script), server.url, TENANT_KEYS[0]], capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = native_text(client, "The quick brown fox", 8)
    assert out["gen"] == expected and out["stream"] == expected
    assert out["batch"] == [native_text(client, "Paris is the capital of", 8), native_text(client, "def main():", 8)]
    assert out["select"] == expected_choice(client, "The capital of France is", [" Paris", " a fox", " blue"])
    assert out["fork"] == [native_text(client, f"The quick brown fox {i}", 4) for i in range(2)]
    assert out["fork_text"] == "The quick brown fox done"
    assert re.fullmatch("[0-9]+", out["regex"]), out["regex"]
