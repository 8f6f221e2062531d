"""vLLM's KV-cache groups as the connector sees them: which block table each layer's blocks use.

With vLLM's hybrid KV-cache manager a model's layers fall into groups, each with its own block
table: full-attention layers in one, sliding-window layers in another (their blocks outside the
window are vLLM's null block, block 0). A kvtier chunk still holds every layer's blocks of its
tokens; each layer's come from its group's table. Groups of kinds whose state is not per-token
KV blocks (Mamba state, cross-attention, MLA and other page layouts) are refused when the engine
starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.errors import ConfigError

#: vLLM's null block: a placeholder in a block table, never read, never holding KV.
NULL_BLOCK = 0
#: The group kinds whose blocks kvtier moves, by vLLM's spec class name.
KINDS = {"FullAttentionSpec": "full", "SlidingWindowSpec": "sliding"}


@dataclass(frozen=True)
class KVGroups:
    """The engine's KV-cache groups: each one's kind (``full`` or ``sliding``) and layers."""

    kinds: tuple[str, ...]
    layers: tuple[tuple[str, ...], ...]

    @classmethod
    def single(cls) -> KVGroups:
        """One full-attention group holding every layer (no hybrid manager)."""
        return cls(("full",), ((),))

    @classmethod
    def of(cls, kv_cache_config: Any) -> KVGroups:
        """The groups of vLLM's ``KVCacheConfig`` (None: one group); a kind kvtier cannot move
        is a ConfigError naming it."""
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if not groups:
            return cls.single()
        kinds, layers = [], []
        for i, group in enumerate(groups):
            name = type(group.kv_cache_spec).__name__
            kind = KINDS.get(name)
            if kind is None:
                raise ConfigError(
                    f"kvtier's vLLM connector moves full and sliding-window attention KV only; "
                    f"KV-cache group {i} is {name} ({len(group.layer_names)} layers): serve this "
                    "model without kvtier"
                )
            kinds.append(kind)
            layers.append(tuple(group.layer_names))
        return cls(tuple(kinds), tuple(layers))

    @property
    def count(self) -> int:
        """Groups (block tables) per request."""
        return len(self.kinds)

    def of_layers(self, names: Sequence[str]) -> list[int]:
        """The group of each layer in ``names`` (every layer in group 0 with one group)."""
        if self.count == 1:
            return [0] * len(names)
        where = {name: g for g, group in enumerate(self.layers) for name in group}
        missing = [n for n in names if n not in where]
        if missing:
            raise ConfigError(f"vLLM's KV caches name layers in no KV-cache group: {missing[:3]}")
        return [where[n] for n in names]


def manager_block_views(kv_caches: dict[str, Any], kv_cache_config: Any) -> dict[str, Any]:
    """Each layer's cache viewed with vLLM's (manager) blocks as dimension 0: where attention
    kernels split a block into smaller kernel blocks, vLLM's ``group_kernel_blocks`` regroups
    them (a view, no copy)."""
    num_blocks = getattr(kv_cache_config, "num_blocks", None)
    if not num_blocks:
        return kv_caches
    from vllm.v1.kv_cache_interface import group_kernel_blocks

    return {
        name: group_kernel_blocks(cache, num_blocks) if cache.shape[0] % num_blocks == 0 else cache
        for name, cache in kv_caches.items()
    }


def usable(ids: Sequence[int]) -> bool:
    """Whether block ids hold KV (none of them vLLM's null block)."""
    return NULL_BLOCK not in ids


__all__ = ["KINDS", "NULL_BLOCK", "KVGroups", "manager_block_views", "usable"]
