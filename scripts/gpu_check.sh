#!/usr/bin/env bash
# GPU check for a lent machine (issue 7 item 5), from a fresh checkout, in under 5 minutes on one H200.
# Uses only what that machine has (python3 with torch, triton, transformers; pytest if present):
#   1. tests/kernels natively on CUDA (the same tests CI runs under TRITON_INTERPRET=1), if pytest exists,
#      but for the compiled CPU ops' tests (test_cpu_*: they build C++ with g++ and say nothing of the GPU);
#   2. benchmarks/bench_kernels.py: every kernel vs its reference at realistic shapes, decode-attention
#      bandwidth vs a measured device-to-device copy, and its table;
#   3. benchmarks/bench_gpu_e2e.py --quick: the Engine in bf16 on SmolLM2 (random weights when it is not
#      cached) and a random 1B Llama: CUDA graphs vs eager at batch 1, batch-64 throughput and batch-1
#      decode vs HF generate; its table is printed;
#   4. only where the real SmolLM2 is there (RADIXLM_DEFAULT_GGUF names its GGUF, or it is converted in
#      radixlm's cache): benchmarks/bench_speculative.py, speculation on vs off at batch 1 and 16 (issue 19),
#      and benchmarks/bench_spec_steps.py, where a 16-row step's time goes on each side (then again with
#      --host-only: the host's time per step alone, the forward replayed from recorded outputs), and
#      bench_speculative.py at 16 rows with --cpu-cuts: the draft cuts this machine's padded verify graphs
#      skip (session 40), kept on: an A/B against the first run's 16-row rows.
# Each part has its own timeout (560 s together, plus start-up; the H200 took ~145 s for parts 1-3 and
# ~70 s for part 4's first script); the end-to-end script stops measuring after --budget seconds so that its table still
# prints. The Engine needs msgspec, pyzmq and platformdirs, which that machine lacks, and the GGUF's
# conversion gguf: carry their wheels in .whl/ (docs/engine.md, "GPU path"); wheels there are installed first.
# Exit status: non-zero if a kernel test, a reference check or a benchmark run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
if compgen -G ".whl/*.whl" >/dev/null; then  # carried wheels (no package index there)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/radixlm-site \
        .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/radixlm-site"
fi

"$PY" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; \
print('gpu:', torch.cuda.get_device_name(), '| torch', torch.__version__, '| triton', triton.__version__)" || exit 2

status=0
if "$PY" -c "import pytest" 2>/dev/null; then
    # -c /dev/null: no project ini (it asks for plugins the machine may lack); rootdir stays the repo
    timeout 75 "$PY" -m pytest -q -p no:cacheprovider -c /dev/null --rootdir "$PWD" --durations=5 \
        --ignore-glob='tests/kernels/test_cpu_*' tests/kernels || status=1
else
    echo "pytest missing: skipping tests/kernels"
fi
timeout 85 "$PY" benchmarks/bench_kernels.py "$@" || status=1
timeout 120 "$PY" benchmarks/bench_gpu_e2e.py --quick --budget 100 || status=1
cached=$("$PY" -c "from radixlm.runtime.model.loader import cache_root; print(cache_root())" 2>/dev/null)
if [ -n "${RADIXLM_DEFAULT_GGUF:-}" ] || [ -f "$cached/models/SmolLM2-135M-Instruct/config.json" ]; then
    timeout 100 "$PY" benchmarks/bench_speculative.py --live --warmup --repeats 2 --workloads json code free \
        || status=1
    # where a 16-row step's time goes, on and off: host phases and the device's time (issue 19's code b16)
    timeout 60 "$PY" benchmarks/bench_spec_steps.py --workloads code free || status=1
    # the same steps with the forward replayed (--host-only): this machine's host time per step alone
    timeout 60 "$PY" benchmarks/bench_spec_steps.py --host-only --workloads code free || status=1
    # the draft cuts that price a draft token by its compute, kept on the padded verify graphs (the A/B)
    timeout 60 "$PY" benchmarks/bench_speculative.py --live --warmup --repeats 2 --batches 16 \
        --workloads code free --cpu-cuts || status=1
else
    echo "the real SmolLM2 is not there (RADIXLM_DEFAULT_GGUF unset, not cached): no speculative bench"
fi
exit $status
