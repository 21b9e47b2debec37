"""What a model run takes from the host's memory: checked before loading, logged once loaded.

Runs in the scheduler process on the CPU. A model that cannot fit fails at start with the numbers (its
weights' bytes, what the machine has available), instead of being killed by the kernel's OOM killer part of
the way through loading or at the first long prompt.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# The share of the available memory the weights may take: the rest is for the KV pool, activations, and
# the tokenizer and detokenizer processes.
WEIGHTS_SHARE = 0.9


def _proc_kb(path: str, key: str) -> int | None:
    """A "Key:  N kB" line of a /proc file, in bytes; None where it cannot be read."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_bytes() -> int:
    """MemAvailable (what can be taken without swapping: free memory plus reclaimable caches)."""
    found = _proc_kb("/proc/meminfo", "MemAvailable")
    return found if found is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident memory (mapped file pages included, as for llama.cpp's mmap'd weights)."""
    return _proc_kb("/proc/self/status", "VmRSS") or 0


def weights_estimate(model_dir: Path, gguf_path: Path | None, quantization: str, dtype: torch.dtype) -> int:
    """The bytes the weights will take once loaded: a GGUF run from its blocks is its file's size; other
    runs hold every value in `dtype` while loading (quantization happens after)."""
    if gguf_path is not None and quantization == "gguf":
        return gguf_path.stat().st_size
    if gguf_path is not None:
        from radixlm.runtime.model.gguf_file import GGUFFile

        values = sum(t.n_elements for t in GGUFFile(gguf_path).tensors)
    else:
        from radixlm.runtime.model.loader import safetensors_shapes, weight_files

        values = sum(math.prod(shape) for f in weight_files(model_dir) for shape in safetensors_shapes(f))
    return values * torch.tensor([], dtype=dtype).element_size()


def check_weights_fit(need: int, what: str) -> None:
    """ValueError naming the numbers when `need` bytes of weights cannot fit in the available memory."""
    have = available_bytes()
    if need > WEIGHTS_SHARE * have:
        raise ValueError(
            f"the model's weights need {need / 2**30:.1f} GiB ({what}) and this machine has "
            f"{have / 2**30:.1f} GiB available: use a smaller or more quantized model (a Q4_K_M GGUF runs in "
            f"about its file's size), or free memory")


def check_kv_fits(kv_bytes: int, tokens: int) -> None:
    """ValueError when a KV pool of an explicit size cannot fit in what is left after the weights."""
    have = available_bytes()
    if kv_bytes > have:
        raise ValueError(
            f"a KV pool of {tokens} tokens needs {kv_bytes / 2**30:.2f} GiB and {have / 2**30:.2f} GiB is "
            f"available after loading the weights: lower --max-total-tokens")


def log_memory(weights: int, kv_bytes: int, tokens: int) -> None:
    logger.info("memory: weights %.1f MB, KV pool %.1f MB (%d tokens), process RSS %.1f MB, available %.1f MB",
                weights / 1e6, kv_bytes / 1e6, tokens, rss_bytes() / 1e6, available_bytes() / 1e6)
