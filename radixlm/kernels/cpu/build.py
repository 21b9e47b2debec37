"""Compile radixlm's C++ CPU ops (csrc/*.cpp) once per machine and load them as torch ops.

Runs in whichever process first asks for them (the scheduler at model load, the tests). The ops are
registered with TORCH_LIBRARY_FRAGMENT under one namespace per instruction set, so the AVX2 build can be
loaded next to the native one and compared with it (tests force the AVX2 path that way).

Why compile at first use and not at install: the ops are built for the CPU they run on (-march=native;
AVX-512 and VNNI where present), which a wheel cannot know. The build (~10-30 s on 2 cores) lands in the
radixlm cache, keyed by the sources, the compiler flags, torch's version and the CPU's flags; every later
process loads the cached .so. Without a C++ compiler (or with RADIXLM_CPU_OPS=0) `load` returns None
and callers keep their torch code, after one log line saying why.

We call g++ ourselves rather than torch.utils.cpp_extension.load: that one needs ninja and pulls in
torch/extension.h (pybind11 and the C++ frontend); these ops need only ATen and torch/library.h.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from functools import cache
from pathlib import Path

import torch

from radixlm.cache import cache_root, file_lock

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXLM_CPU_OPS"  # "0" turns the compiled ops off (torch code everywhere)
CSRC = Path(__file__).with_name("csrc")
# What each instruction-set build targets. "native" is this CPU; "avx2" is the x86-64-v3 level (AVX2, FMA,
# F16C, no AVX-512), the path AVX2-only machines take, kept testable on AVX-512 ones.
ISA_FLAGS = {"native": ["-march=native"], "avx2": ["-march=x86-64-v3"]}
_CFLAGS = ["-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-w",
           # fp32 products and sums are rounded as written (no FMA contraction): the ops that promise
           # torch's exact arithmetic (rotary) keep it, and results do not depend on the ISA build.
           "-ffp-contract=off"]


def namespace(isa: str) -> str:
    """The torch.ops namespace an ISA build registers its ops under."""
    return f"radixlm_{isa}"


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0"


def default_isa() -> str:
    """The build this process runs: "avx2" where torch itself dispatches at AVX2 (an AVX2-only CPU, or
    ATEN_CPU_CAPABILITY=avx2 forcing that path), else "native". Every caller must use the same build: a
    weight packed by one build's pack_rows has that build's tile shape."""
    return "avx2" if torch.backends.cpu.get_cpu_capability() == "AVX2" else "native"


def load(isa: str | None = None):
    """torch.ops.<namespace(isa)> with the ops compiled and loaded (isa None: default_isa()), or None when
    they cannot be (logged)."""
    return _load(default_isa() if isa is None else isa)


@cache
def _load(isa: str):
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa must be one of {', '.join(ISA_FLAGS)}; got {isa!r}")
    if not enabled():
        logger.info("compiled CPU ops off (%s=0): torch ops everywhere", DISABLE_ENV)
        return None
    if sys.platform != "linux" or not _x86():
        logger.info("compiled CPU ops are built for x86-64 Linux only; torch ops everywhere")
        return None
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        logger.warning("no C++ compiler (g++) found: radixlm's compiled CPU ops are off, torch ops instead "
                       "(slower CPU decode); install g++ to turn them on")
        return None
    try:
        path = _build(compiler, isa)
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logger.warning("radixlm's compiled CPU ops did not build or load (%s); torch ops instead", e)
        return None
    return getattr(torch.ops, namespace(isa))


def _x86() -> bool:
    import platform

    return platform.machine() in ("x86_64", "AMD64")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _command(compiler: str, isa: str, sources: list[Path], out: Path) -> list[str]:
    tdir = Path(torch.__file__).parent
    return [compiler, *_CFLAGS, *ISA_FLAGS[isa], f"-DRADIXLM_NS={namespace(isa)}",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{tdir / 'include'}", f"-I{tdir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            f"-I{CSRC}", *map(str, sources), "-o", str(out),
            # libgomp: torch ships its own libgomp.so.1; the same soname makes the loader reuse torch's
            # already-loaded OpenMP runtime (one thread pool, not two).
            f"-L{tdir / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{tdir / 'lib'}"]


def _build(compiler: str, isa: str) -> Path:
    sources = sorted(CSRC.glob("*.cpp"))
    key = hashlib.sha256()
    for f in sorted(CSRC.iterdir()):
        key.update(f.name.encode() + f.read_bytes())
    key.update(" ".join(_command(compiler, isa, [], Path("x"))).encode())
    key.update((torch.__version__ + sysconfig.get_platform()).encode())
    if isa == "native":
        key.update(_cpu_flags().encode())
    out_dir = cache_root() / "cpu_ops" / key.hexdigest()[:16]
    out = out_dir / f"{namespace(isa)}.so"
    if out.exists():
        return out
    with file_lock(out_dir / ".lock"):
        if out.exists():  # another process built it while we waited
            return out
        logger.info("compiling radixlm's CPU ops for %s (once per machine; ~10-30 s)", isa)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            tmp_out = Path(tmp) / out.name
            done = subprocess.run(_command(compiler, isa, sources, tmp_out), capture_output=True, text=True,
                                  timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
            os.replace(tmp_out, out)  # readers never see a half-written library
    return out
