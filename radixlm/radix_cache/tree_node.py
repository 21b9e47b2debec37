"""TreeNode and MatchResult: the radix tree's node type. Runs inside the scheduler process.

A node holds one edge of the compressed trie: `key` is the run of token ids on the edge from its parent,
`slots` the KV-pool slot of each of those tokens (int64, same length, page size 1), `logprobs` their prompt
logprobs where some request computed them (token_logprobs.py; None = none known). Roots (one per namespace)
hold an empty key and are never locked, evicted or counted.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from radixlm.radix_cache.token_logprobs import TokenLogprobs

_NODE_IDS = itertools.count()


class TreeNode:
    """One edge of the radix tree.

    Invariants (checked by RadixCache.check_integrity):
    - non-root: len(key) >= 1 and slots.shape == (len(key),), dtype int64;
    - children maps a child's first token to the child, so siblings start with distinct tokens;
    - lock_ref counts the holders of this node or of any descendant: a lock on a node increments it
      and every ancestor, so lock_ref >= sum(child.lock_ref for child in children);
    - last_access_time is a logical clock tick; a path is touched as a whole, so a parent's time is
      never older than a child's (which is what makes leaf-first LRU eviction evict in LRU order);
    - hit_count counts admitted requests whose cached prefix ran through this node (RadixCache.record_hit
      counts a hit on the node and every ancestor, as a lock), so hit_count >= sum(child.hit_count).
    last_access_s (time.monotonic of the last touch) is for display only (the dashboard): eviction order
    never reads the wall clock.
    """

    __slots__ = (
        "namespace",
        "key",
        "slots",
        "children",
        "parent",
        "lock_ref",
        "last_access_time",
        "is_root",
        "node_id",
        "hit_count",
        "last_access_s",
        "logprobs",
    )

    def __init__(
        self,
        namespace: str,
        key: tuple[int, ...],
        slots: torch.Tensor,
        parent: TreeNode | None,
        last_access_time: int,
        is_root: bool = False,
    ) -> None:
        self.namespace = namespace
        self.key = key
        self.slots = slots  # int64 [len(key)]
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access_time = last_access_time
        self.is_root = is_root
        # Unique and increasing: a deterministic tie-break for the eviction heap and a name in dumps.
        self.node_id = next(_NODE_IDS)
        self.hit_count = 0
        self.last_access_s = time.monotonic()
        self.logprobs: TokenLogprobs | None = None  # one entry per token of key, or None (nothing known)

    @classmethod
    def new_root(cls, namespace: str, device: torch.device | str) -> TreeNode:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return cls(namespace, (), empty, parent=None, last_access_time=0, is_root=True)

    def is_leaf(self) -> bool:
        return not self.children

    def depth_tokens(self) -> int:
        """Number of tokens on the path from the root to the end of this node."""
        total, node = 0, self
        while node is not None:
            total += len(node.key)
            node = node.parent
        return total

    def __repr__(self) -> str:
        kind = "root" if self.is_root else f"key={list(self.key)}"
        return f"TreeNode#{self.node_id}(ns={self.namespace!r}, {kind}, lock_ref={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    """What match_prefix found: the tree's slots for the longest cached prefix and the node it ends at.

    `slots` are the tree's own slots (int64 [prefix_len]); a request that uses them must lock
    `last_node` (inc_lock_ref) before anything can evict, and must never free them itself.
    """

    slots: torch.Tensor
    last_node: TreeNode

    @property
    def prefix_len(self) -> int:
        return int(self.slots.numel())


def common_prefix_len(key: tuple[int, ...], token_ids: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of `key` and `token_ids[start:]`."""
    limit = min(len(key), len(token_ids) - start)
    i = 0
    while i < limit and key[i] == token_ids[start + i]:
        i += 1
    return i


def split_node(child: TreeNode, at: int) -> TreeNode:
    """Cut child after `at` tokens; the new node takes the head, `child` keeps the tail.

    The existing object keeps the deeper end, so anyone holding it (a request's last_node, a
    lock) still refers to the same token path. The head inherits lock_ref (every lock through
    the tail also went through the head) and the time; counters do not change.
    """
    parent = child.parent
    assert parent is not None and 0 < at < len(child.key)
    head = TreeNode(child.namespace, child.key[:at], child.slots[:at].clone(), parent,
                    child.last_access_time)
    head.lock_ref = child.lock_ref
    head.hit_count, head.last_access_s = child.hit_count, child.last_access_s  # every hit on the tail was one here
    child.key, child.slots = child.key[at:], child.slots[at:].clone()
    if child.logprobs is not None:
        head.logprobs, child.logprobs = child.logprobs.slice(0, at), child.logprobs.slice(at, len(child.logprobs))
    child.parent = head
    head.children[child.key[0]] = child
    parent.children[head.key[0]] = head  # same dict key: keeps the sibling order
    return head


@dataclass
class RadixStats:
    """Cumulative counters (tokens unless named otherwise); the engine exports them as metrics."""

    evicted_tokens: int = 0
    evicted_nodes: int = 0
    inserted_tokens: int = 0  # tokens that became new tree entries
    duplicate_tokens_freed: int = 0  # caller slots freed by insert because the tree already had them
    resets: int = 0


def subtree(root: TreeNode) -> Iterator[TreeNode]:
    """Every non-root node under root (iterative: chains can be deeper than the recursion limit)."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def format_subtree(root: TreeNode) -> list[str]:
    """Indented dump of one namespace, children in insertion order (for debugging and test failures)."""
    num_tokens = sum(len(node.key) for node in subtree(root))
    lines = [f"namespace {root.namespace!r}: {num_tokens} tokens"]
    stack = [(child, 1) for child in reversed(list(root.children.values()))]
    while stack:
        node, depth = stack.pop()
        lines.append(
            f"{'  ' * depth}#{node.node_id} key={list(node.key)} slots={node.slots.tolist()} "
            f"lock={node.lock_ref} t={node.last_access_time}"
        )
        stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
    return lines


def check_node(node: TreeNode, namespace: str) -> None:
    """Local invariants of one reachable non-root node (RadixCache.check_integrity adds the global ones)."""
    parent = node.parent
    assert parent is not None and not node.is_root, f"{node!r}: detached node reachable"
    assert parent.children.get(node.key[0] if node.key else None) is node, f"{node!r}: bad child link"
    assert node.key, f"{node!r}: empty non-root node"
    assert node.namespace == namespace, f"{node!r}: in namespace {namespace!r}"
    assert node.slots.dtype == torch.int64 and node.slots.shape == (len(node.key),), (
        f"{node!r}: slots {node.slots.dtype} {tuple(node.slots.shape)} for {len(node.key)} tokens"
    )
    assert node.logprobs is None or len(node.logprobs) == len(node.key), f"{node!r}: logprobs length"
    assert node.lock_ref >= 0, f"{node!r}: negative lock_ref"
    child_refs = sum(child.lock_ref for child in node.children.values())
    assert node.lock_ref >= child_refs, f"{node!r}: lock_ref < sum of children's {child_refs}"
    child_hits = sum(child.hit_count for child in node.children.values())
    assert node.hit_count >= child_hits, f"{node!r}: hit_count {node.hit_count} < sum of children's {child_hits}"
    if not parent.is_root:
        assert parent.last_access_time >= node.last_access_time, f"{node!r}: newer than its parent"
