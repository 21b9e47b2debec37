"""Scheduling policies: lpm, dfs-weight (against a literal port of SGLang's definition), fcfs, lof,
random, and the fcfs fallbacks."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.radix_cache import RadixCache, TreeNode
from radixlm.runtime.scheduler.policy import POLICY_NAMES, SchedulePolicy


@dataclass(eq=False)
class Waiting:
    input_ids: list[int]
    arrival: int
    namespace: str = ""
    output_ids: list[int] = field(default_factory=list)
    max_new_tokens: int = 16
    prefix_len: int = -1  # sentinel: "never computed"
    last_node: TreeNode | None = None


class Slots:
    """Hands out fresh slot numbers; frees are only counted (policies must never free anything)."""

    def __init__(self) -> None:
        self.next = 0
        self.num_freed = 0

    def alloc(self, n: int) -> torch.Tensor:
        self.next += n
        return torch.arange(self.next - n, self.next, dtype=torch.int64)

    def free(self, slots: torch.Tensor) -> None:
        self.num_freed += slots.numel()


def make_tree(seqs: list[list[int]], namespace: str = "") -> RadixCache:
    slots = Slots()
    tree = RadixCache(slots.free)
    for seq in seqs:
        tree.insert(namespace, seq, slots.alloc(len(seq)))
    return tree


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(ValueError) as err:
        SchedulePolicy("sjf", None)
    assert all(name in str(err.value) for name in POLICY_NAMES)


def test_lpm_orders_by_cached_prefix_and_changes_no_lock():
    tree = make_tree([[1, 2, 3, 4, 5, 6], [1, 2, 9], [7, 7, 7]])
    waiting = [
        Waiting([8, 8], arrival=0),  # 0 cached
        Waiting([1, 2, 3, 4, 0], arrival=1),  # 4
        Waiting([7, 7, 7, 7], arrival=2),  # 3
        Waiting([1, 2, 9, 9], arrival=3),  # 3, later arrival than the [7,7,7] one
        Waiting([1, 2], arrival=4, output_ids=[3, 4, 5, 6, 1]),  # retracted: key includes outputs, 6
    ]
    ordered = SchedulePolicy("lpm", tree).order(waiting[::-1])  # ties break by arrival, not position
    assert [w.arrival for w in ordered] == [4, 1, 2, 3, 0]
    assert [w.prefix_len for w in waiting] == [0, 4, 3, 3, 6]
    assert tree.protected_size() == 0 and tree.total_size() == 10
    again = SchedulePolicy("lpm", tree).order(waiting[::-1])  # safe to repeat: same answer
    assert again == ordered and [w.prefix_len for w in waiting] == [0, 4, 3, 3, 6]
    tree.check_integrity()


def test_dfs_weight_hand_built_example():
    # Tree: root -> [1,2] -> {[3,3], [4,4]};  root -> [5,5]
    tree = make_tree([[1, 2, 3, 3], [1, 2, 4, 4], [5, 5]])
    r0 = Waiting([5, 5, 5], arrival=0)  # ends at [5,5]
    r1 = Waiting([1, 2, 3, 3, 0], arrival=1)  # ends at [3,3]
    r2 = Waiting([1, 2, 4, 4], arrival=2)  # ends at [4,4]
    r3 = Waiting([1, 2, 4, 4, 1], arrival=3)  # ends at [4,4]
    r4 = Waiting([1, 2, 9], arrival=4)  # ends at [1,2]
    r5 = Waiting([7], arrival=5)  # ends at the root
    # Weights: [4,4]=2, [3,3]=1, [1,2]=4 (2+1+its own 1), [5,5]=1, root=6. Heavier child first,
    # a node's own requests after its subtree: [4,4]: r2 r3; [3,3]: r1; [1,2]: r4; [5,5]: r0; root: r5.
    ordered = SchedulePolicy("dfs-weight", tree).order([r0, r1, r2, r3, r4, r5])
    assert ordered == [r2, r3, r1, r4, r0, r5]
    assert tree.protected_size() == 0
    tree.check_integrity()


def sglang_dfs_weight(root: TreeNode, waiting: list[Waiting]) -> list[Waiting]:
    """Literal port of SGLang's _sort_by_dfs_weight / _calc_weight / _get_dfs_priority (recursive)."""
    last_node_to_reqs = defaultdict(list)
    for req in waiting:
        last_node_to_reqs[req.last_node].append(req)
    node_to_weight = defaultdict(int)
    for node in last_node_to_reqs:
        node_to_weight[node] = len(last_node_to_reqs[node])

    def calc_weight(cur):
        for child in cur.children.values():
            calc_weight(child)
            node_to_weight[cur] += node_to_weight[child]

    def get_dfs_priority(cur, q):
        childs = list(cur.children.values())
        childs.sort(key=lambda x: -node_to_weight[x])
        for child in childs:
            get_dfs_priority(child, q)
        q.extend(last_node_to_reqs[cur])

    calc_weight(root)
    q: list[Waiting] = []
    get_dfs_priority(root, q)
    return q


short_seqs = st.lists(st.integers(0, 3), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(cached=st.lists(short_seqs, max_size=8), queries=st.lists(short_seqs, min_size=1, max_size=10))
def test_dfs_weight_matches_sglang_on_random_trees(cached, queries):
    tree = make_tree(cached)
    waiting = [Waiting(q, arrival=i) for i, q in enumerate(queries)]
    ordered = SchedulePolicy("dfs-weight", tree).order(waiting)
    assert ordered == sglang_dfs_weight(tree.root(""), waiting)
    tree.check_integrity()


def test_dfs_weight_across_namespaces_and_unknown_namespace_last():
    slots = Slots()
    tree = RadixCache(slots.free)
    tree.insert("a", [1, 1], slots.alloc(2))
    tree.insert("b", [1, 1], slots.alloc(2))
    a = Waiting([1, 1], arrival=0, namespace="a")
    b1 = Waiting([1, 1], arrival=1, namespace="b")
    b2 = Waiting([1, 1, 2], arrival=2, namespace="b")
    stranger = Waiting([1, 1], arrival=3, namespace="never-seen")
    ordered = SchedulePolicy("dfs-weight", tree).order([stranger, a, b1, b2])
    assert ordered == [b1, b2, a, stranger]  # namespace b has weight 2: first
    assert [w.prefix_len for w in (a, b1, b2, stranger)] == [2, 2, 2, 0]


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_cache_aware_policies_fall_back_to_fcfs(name):
    tree = make_tree([[1, 2, 3]])
    waiting = [Waiting([9], arrival=1), Waiting([1, 2, 3], arrival=2), Waiting([5], arrival=0)]
    policy = SchedulePolicy(name, tree, fcfs_threshold=2)
    assert policy.active_policy(3) == "fcfs" and policy.active_policy(2) == name
    assert [w.arrival for w in policy.order(waiting)] == [0, 1, 2]
    assert all(w.prefix_len == -1 for w in waiting)  # fcfs matched nothing
    assert [w.arrival for w in policy.order(waiting[:2])] == [2, 1]  # under the threshold: cache-aware
    for tree_off in (None, RadixCache(lambda s: None, disable=True)):
        off = SchedulePolicy(name, tree_off)
        assert off.active_policy(1) == "fcfs"
        assert [w.arrival for w in off.order(waiting)] == [0, 1, 2]


def test_default_threshold_is_sglangs():
    policy = SchedulePolicy("lpm", make_tree([]))
    assert policy.active_policy(128) == "lpm" and policy.active_policy(129) == "fcfs"


def test_fcfs_and_lof():
    waiting = [
        Waiting([1], arrival=2, max_new_tokens=8),
        Waiting([1], arrival=0, max_new_tokens=64),
        Waiting([1], arrival=1, max_new_tokens=8),
        Waiting([1], arrival=3, max_new_tokens=128),
    ]
    snapshot = list(waiting)
    assert [w.arrival for w in SchedulePolicy("fcfs", None).order(waiting)] == [0, 1, 2, 3]
    assert [w.arrival for w in SchedulePolicy("lof", None).order(waiting)] == [3, 0, 1, 2]
    assert waiting == snapshot  # order() returns a new list


def test_random_is_a_seeded_permutation():
    waiting = [Waiting([1], arrival=i) for i in range(12)]

    def orders(seed: int) -> list[list[int]]:
        policy = SchedulePolicy("random", None, seed=seed)
        return [[w.arrival for w in policy.order(waiting)] for _ in range(3)]

    first = orders(7)
    assert first == orders(7)
    assert all(sorted(o) == list(range(12)) for o in first)
    assert any(orders(seed) != first for seed in range(8, 12))
    assert len({tuple(o) for o in first}) > 1  # successive calls keep drawing
