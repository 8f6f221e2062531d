"""The engine's paged KV pool with prefix caching by chained block keys, as vLLM keeps it.

Blocks hold ``block_tokens`` tokens. A full block computed by a request is registered under its
key; when no request uses it any more it joins the free queue but stays findable until the
block is handed out again (then its key is forgotten: evicted from the prefix cache). Free
blocks are handed out least recently freed first, and a finished request's blocks are freed
tail first, so a prompt's shared head outlives its private tail.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvtier.errors import ConfigError


class EnginePool:
    """``blocks`` blocks of ``block_tokens`` tokens; see the module docs."""

    def __init__(self, blocks: int, block_tokens: int):
        if blocks < 1 or block_tokens < 1:
            raise ConfigError("the engine pool needs at least one block of at least one token")
        self.blocks = blocks
        self.block_tokens = block_tokens
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(blocks))
        self.ref = [0] * blocks
        self.key_of: list[bytes | None] = [None] * blocks
        self.cached: dict[bytes, int] = {}
        self.evicted = 0

    def free_count(self) -> int:
        """Blocks a request may take (free ones, cached or not)."""
        return len(self.free)

    def used_count(self) -> int:
        """Blocks some request holds."""
        return self.blocks - len(self.free)

    def lookup(self, keys: Sequence[bytes], limit: int) -> int:
        """How many of the leading ``keys`` (at most ``limit``) the cache holds."""
        n = 0
        cached = self.cached
        for key in keys[:limit]:
            if key not in cached:
                break
            n += 1
        return n

    def reusable_free(self, keys: Sequence[bytes]) -> int:
        """How many of these cached blocks sit in the free queue (taking them uses free room)."""
        return sum(1 for k in keys if self.ref[self.cached[k]] == 0)

    def take_cached(self, keys: Sequence[bytes]) -> list[int]:
        """The blocks of cached ``keys``, now held once more."""
        out = []
        for key in keys:
            block = self.cached[key]
            if self.ref[block] == 0:
                del self.free[block]
            self.ref[block] += 1
            out.append(block)
        return out

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks (evicting their old keys), or None when fewer are free."""
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            key = self.key_of[block]
            if key is not None:
                if self.cached.get(key) == block:
                    del self.cached[key]
                self.key_of[block] = None
                self.evicted += 1
            self.ref[block] = 1
            out.append(block)
        return out

    def register(self, block: int, key: bytes) -> None:
        """A full block was computed: findable by ``key`` (the first block with a key wins)."""
        if key not in self.cached:
            self.cached[key] = block
            self.key_of[block] = key

    def release(self, blocks: Sequence[int]) -> None:
        """A request let go of ``blocks`` (its whole list, head first): tail first to the queue."""
        for block in reversed(blocks):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free[block] = None


__all__ = ["EnginePool"]
