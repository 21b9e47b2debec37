"""runtime/heap.py: a loaded process's objects leave the garbage collector's passes (gc.freeze), and an
in-process Engine gives them back when the last one shuts down."""

import gc

from radixlm.runtime import heap
from radixlm.runtime.engine import Engine


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_frozen_objects_skip_collections_until_the_last_holder_releases() -> None:
    held = heap._holders
    node = Node()
    heap.freeze_heap("outer")
    heap.freeze_heap("inner")
    assert gc.get_freeze_count() > 0
    del node  # now cyclic garbage, but frozen: a full collection does not see it
    assert not any(type(o) is Node for o in gc.get_objects())
    gc.collect()
    heap.release_heap()
    assert heap._holders == held + 1 and gc.get_freeze_count() > 0  # the outer freeze still holds
    heap.release_heap()
    assert heap._holders == held
    if held == 0:
        assert gc.get_freeze_count() == 0
        assert any(type(o) is Node for o in gc.get_objects())  # back in the collector's generations
        gc.collect()
        assert not any(type(o) is Node for o in gc.get_objects())  # and freed


def test_release_without_a_freeze_is_a_no_op() -> None:
    held = heap._holders
    if held == 0:
        heap.release_heap()
        assert heap._holders == 0


def test_an_engine_freezes_the_heap_while_it_lives(tiny_llama_dir) -> None:
    held = heap._holders
    engine = Engine(str(tiny_llama_dir), max_total_tokens=256)
    try:
        assert heap._holders == held + 1
        assert gc.get_freeze_count() > 0
        out = engine.generate("hello", {"max_new_tokens": 3, "temperature": 0})
        assert len(out["output_ids"]) == 3
    finally:
        engine.shutdown()
    assert heap._holders == held
    engine.shutdown()  # a second shutdown releases nothing more
    assert heap._holders == held
    if held == 0:
        assert gc.get_freeze_count() == 0
