"""Host-to-device copies that do not synchronise the host with the device.

Runs in the scheduler process, once or a few times per step. A plain `.to("cuda")` (or
`torch.tensor(list, device="cuda")`) from ordinary pageable memory is, in PyTorch, a cudaMemcpyAsync
followed by cudaStreamSynchronize: the host waits for every kernel queued before it. A copy from pinned
memory with non_blocking=True is queued like a kernel instead, so the host can go on planning while the
device works (SGLang stages its per-step inputs the same way).
"""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` (a CPU tensor the caller no longer writes to) on `device`, without a host sync on CUDA.

    The pinned staging copy comes from PyTorch's caching host allocator, which records an event on the
    copy's stream, so the staging block is not reused before the device has read it. On other devices
    this is a plain `.to(device)` (a no-op on CPU)."""
    device = torch.device(device)
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
