"""The machine a benchmark's numbers come from, printed with them: the CPU (model, cores, the ISA flags the
CPU kernels care about, torch's CPU capability), torch's version and, where there is one, the GPU.

Imported by the benchmark scripts (`import machine_info` when run as a script, `benchmarks.machine_info`
as a module)."""

from __future__ import annotations

import os
import platform
import subprocess

FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_line() -> str:
    """'<model>, <n> CPUs, flags: ...' from lscpu (the platform's name where lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, flags: lscpu unavailable"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    model = fields.get("Model name", "?").strip()
    return f"{model}, {fields.get('CPU(s)', '?').strip()} CPUs, flags: {' '.join(f for f in FLAGS if f in flags)}"


def machine_lines() -> list[str]:
    """The CPU line, torch's version and CPU capability, and the GPU (name, CUDA) where torch sees one."""
    import torch

    lines = [f"CPU {cpu_line()}",
             f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}"]
    if torch.cuda.is_available():
        lines.append(f"GPU {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}")
    return lines
