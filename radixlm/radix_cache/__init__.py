"""radixlm.radix_cache: the RadixAttention prefix tree (token ids -> KV slots). Scheduler process."""

from radixlm.radix_cache.radix_cache import DEFAULT_NAMESPACE, RadixCache
from radixlm.radix_cache.tree_node import MatchResult, RadixStats, TreeNode

__all__ = ["DEFAULT_NAMESPACE", "MatchResult", "RadixCache", "RadixStats", "TreeNode"]
