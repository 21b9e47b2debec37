"""What the CPU computes natively, for choosing weight formats: torch's dispatch level and /proc/cpuinfo.

Runs in the scheduler process at start-up. torch picks its vectorized kernels by
torch.backends.cpu.get_cpu_capability() ("AVX512", "AVX2", "DEFAULT", ...), which ATEN_CPU_CAPABILITY
can lower (tests force the AVX2 path that way); bf16 is native only where that level is AVX512 and the
CPU has the AVX512-BF16 or AMX-BF16 instructions. Otherwise oneDNN emulates bf16 matmuls by converting
to fp32, which is slower than fp32 itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class CpuCaps:
    capability: str  # torch.backends.cpu.get_cpu_capability()
    flags: frozenset[str]  # the CPU's flags (/proc/cpuinfo), empty where unreadable

    @property
    def avx512(self) -> bool:
        return self.capability.startswith("AVX512")

    @property
    def native_bf16(self) -> bool:
        return self.avx512 and bool({"avx512_bf16", "amx_bf16"} & self.flags)

    @property
    def vnni(self) -> bool:
        return self.avx512 and "avx512_vnni" in self.flags

    def describe(self) -> str:
        shown = sorted(f for f in self.flags if f in _SHOWN_FLAGS)
        return f"{self.capability} ({' '.join(shown) or 'no AVX flags'})"


_SHOWN_FLAGS = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile"}


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_caps() -> CpuCaps:
    return CpuCaps(torch.backends.cpu.get_cpu_capability(), read_cpu_flags())
