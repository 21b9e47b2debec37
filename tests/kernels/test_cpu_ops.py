"""The compiled CPU ops (radixlm/kernels/cpu): each against its torch reference, in the native build and the
AVX2 build (the path an AVX2-only machine takes, forced here), plus the build's caching and its fall-back."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from radixlm.kernels.cpu import build, reference

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")


@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("hidden", [576, 37])  # 37: a row that is not a multiple of any vector width
def test_rms_norm_matches_torch(ops, rows: int, hidden: int) -> None:
    g = torch.Generator().manual_seed(rows * hidden)
    x, w = torch.randn(rows, hidden, generator=g) * 3, torch.randn(hidden, generator=g)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_add_rms_norm_updates_residual_in_place(ops, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x, residual, w = torch.randn(rows, 576, generator=g), torch.randn(rows, 576, generator=g), torch.randn(576, generator=g)
    want, want_residual = reference.add_rms_norm(x, residual, w, 1e-6)
    got = ops.add_rms_norm(x, residual, w, 1e-6)
    assert torch.equal(residual, want_residual)  # the same fp32 adds, written back into residual
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def test_norm_rows_do_not_depend_on_the_batch(ops) -> None:
    """A row's result is the same alone and among 40 others (speculation and batching rely on it)."""
    x, w = torch.randn(40, 576), torch.randn(576)
    together = ops.rms_norm(x, w, 1e-5)
    assert all(torch.equal(ops.rms_norm(x[i : i + 1].clone(), w, 1e-5)[0], together[i]) for i in range(40))


def test_bad_input_is_a_clear_error(ops) -> None:
    with pytest.raises(RuntimeError, match="fp32"):
        ops.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8), 1e-5)
    with pytest.raises(RuntimeError, match="weight"):
        ops.rms_norm(torch.randn(2, 8), torch.randn(9), 1e-5)


def test_a_cached_build_is_reused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    compiler = shutil.which("g++")
    first = build._build(compiler, "avx2")
    stamp = first.stat().st_mtime_ns
    assert build._build(compiler, "avx2") == first and first.stat().st_mtime_ns == stamp


def test_disabled_or_without_a_compiler_the_callers_keep_torch(monkeypatch, caplog) -> None:
    build._load.cache_clear()
    try:
        monkeypatch.setenv(build.DISABLE_ENV, "0")
        assert build.load("native") is None
        monkeypatch.delenv(build.DISABLE_ENV)
        build._load.cache_clear()  # load() remembers its answer per ISA (in _load)
        monkeypatch.setenv("CXX", "no-such-compiler-radixlm")
        with caplog.at_level(logging.WARNING, logger=build.__name__):
            assert build.load("native") is None
        assert "no C++ compiler" in caplog.text
    finally:
        build._load.cache_clear()
