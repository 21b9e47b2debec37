"""Shared fixtures: tiny random checkpoints built once per test session in tmp dirs (nothing downloaded)."""

from __future__ import annotations

import os

import pytest

# Two cores: oversubscribed OpenMP threads make tiny matmuls far slower.
os.environ.setdefault("OMP_NUM_THREADS", "2")

# Triton decorates its own standard library (tl.zeros, ...) when triton.language is first imported, in
# interpreter mode or not, so TRITON_INTERPRET must be set before ANY test module imports triton (some
# import radixlm.kernels at collection, before tests/kernels/conftest.py would run). Without CUDA the
# kernels only run in the interpreter anyway.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _give_memory_back() -> None:
    """Collect what a module's engines and grammar caches left (cycles included) and hand the freed heap
    back to the OS: glibc keeps freed small and mid-sized blocks (a model's weights, compiled grammars) in
    its arenas, so one pytest process would otherwise keep every module's peak to the end."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc and hasattr(ctypes.CDLL(libc), "malloc_trim"):  # glibc only
        ctypes.CDLL(libc).malloc_trim(0)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(autouse=True)
def _memory_back_after_big_tests():
    """After a test that left the process big (an engine on the real model, hundreds of compiled grammars),
    give the memory back, so the suite's peak is one test's, not the sum of them (a laptop runs it too)."""
    yield
    if os.path.exists("/proc/self/statm") and _rss_bytes() > 1 << 30:
        _give_memory_back()


def _build(tmp_path_factory, arch: str, **overrides):
    from radixlm.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp(f"tiny_{arch}"), arch=arch, **overrides)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return _build(tmp_path_factory, "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    return _build(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    return _build(tmp_path_factory, "qwen3")


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory):
    return _build(tmp_path_factory, "mistral")


@pytest.fixture(scope="session")
def tiny_phi3_dir(tmp_path_factory):
    return _build(tmp_path_factory, "phi3")


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory):
    return _build(tmp_path_factory, "gemma3")
