"""Keep the start-up heap out of the garbage collector's full passes (gc.freeze, as vLLM does after warm-up
and SGLang's freeze_gc).

Runs in every radixlm process once it has loaded what it keeps for its lifetime (the scheduler process and
the in-process Engine after the model and tokenizer, the detokenizer, the server's tokenizer manager, a
tensor-parallel rank). A loaded process holds ~300k objects tracked by the collector (torch, transformers,
the tokenizer, the model's modules); each full (generation 2) collection walks all of them, ~0.15 s on a
laptop core, and one runs whenever enough new objects have survived, which the scheduler's per-request
state (n-gram indexes, radix nodes) makes happen every few seconds: a stall of a whole decode step and
more (docs/benchmarks.md). Frozen objects are still freed by reference counting; only cycles
among them wait until they are unfrozen (release_heap, when the last in-process Engine shuts down).
"""

from __future__ import annotations

import gc
import logging
import threading

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_holders = 0  # in-process Engines alive that froze the heap (a server process never releases)


def freeze_heap(context: str) -> int:
    """Collect garbage, then move every object alive into the permanent generation; returns how many
    objects are frozen."""
    global _holders
    with _lock:
        gc.collect()
        gc.freeze()
        _holders += 1
        frozen = gc.get_freeze_count()
    logger.info("%s: %d objects frozen out of the garbage collector's passes", context, frozen)
    return frozen


def release_heap() -> None:
    """Undo one freeze_heap (an Engine shutting down): the last one unfreezes, so what the process held
    then can be collected again."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()
