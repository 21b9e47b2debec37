#!/usr/bin/env bash
# One-time (idempotent) set-up: a virtual environment in .venv with the pinned CPU torch wheel,
# then radixlm itself with its test extra. torch==2.13.0 goes first so the project's `torch>=`
# requirement is already met and pip never pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.radixlm-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
# The stock SGLang frontend (sglang==0.5.2 needs no torch; its frontend also imports pybase64 and pydantic)
# in a venv of its own, for tests/server/test_sglang_frontend.py (which skips without it).
if [ ! -x .venv/sglang-frontend/bin/python ]; then
  "$PY" -m venv .venv/sglang-frontend
  .venv/sglang-frontend/bin/python -m pip install -q "sglang==0.5.2" pybase64 pydantic \
    || echo "setup: the stock sglang frontend did not install; its server test will skip" >&2
fi
