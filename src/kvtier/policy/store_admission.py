"""Which chunks of a prompt earlier prompts also held, and whether recent prompts repeat at all.

Storing a computed chunk costs the engine's host a copy out of its memory, a checksum and a write
per tier, whether or not the chunk is ever asked for again, and a one-shot prompt's chunks
displace others that would be. A store side asks this book which new chunks are worth it: one
that an earlier prompt held too has shown reuse (the doorkeeper of frequency-based admission);
and while recent prompts repeat chunks at all, every chunk is, because the first sight of a
shared prefix is the one that turns its later sights into hits.

Chunk keys are chained (a key covers every token before it), so the repeated chunks of a prompt
are a leading run: storing only them still stores a prefix. Not thread-safe: the caller
serialises calls.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

#: What a store side stores: every chunk, only repeated ones, or every chunk while prompts repeat.
ADMIT_MODES = ("always", "repeat", "auto")


class Sightings:
    """Chunk keys seen in prompts (the most recent ``memory`` of them) and, over the last
    ``window`` prompts sighted, how many repeated a chunk of an earlier prompt."""

    def __init__(self, window: int = 16, memory: int = 1 << 16):
        if window < 1 or memory < 1:
            raise ValueError("Sightings needs window >= 1 and memory >= 1")
        self.window = window
        self.memory = memory
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._recent: deque[bool] = deque(maxlen=window)
        self._repeats = 0

    def sight(self, keys: Sequence[bytes]) -> list[bool]:
        """Record one prompt's chunk keys; for each, whether an earlier prompt held it."""
        seen = self._seen
        out = []
        for key in keys:
            repeat = key in seen
            if repeat:
                seen.move_to_end(key)
            else:
                seen[key] = None
                if len(seen) > self.memory:
                    seen.popitem(last=False)
            out.append(repeat)
        if out:  # a prompt without a whole chunk says nothing either way
            if len(self._recent) == self.window:
                self._repeats -= self._recent[0]
            repeated = any(out)
            self._recent.append(repeated)
            self._repeats += repeated
        return out

    @property
    def repeating(self) -> bool:
        """Whether any of the last ``window`` prompts repeated a chunk of an earlier one (true
        until ``window`` prompts have been sighted: nothing is known against storing yet)."""
        return len(self._recent) < self.window or self._repeats > 0


class StoreAdmission:
    """Which computed chunks a store side stores, by ``mode`` (one of :data:`ADMIT_MODES`):
    ``always`` every one; ``repeat`` those an earlier prompt held; ``auto`` every one while
    :attr:`Sightings.repeating`, else as ``repeat``. The vLLM connector and the simulator's share
    this, so both decide alike."""

    def __init__(self, mode: str = "auto", sightings: Sightings | None = None):
        if mode not in ADMIT_MODES:
            raise ValueError(f"admit must be one of {ADMIT_MODES}, got {mode!r}")
        self.mode = mode
        self.sightings = sightings or Sightings()

    @property
    def books(self) -> bool:
        """Whether prompts need sighting (``always`` keeps no book)."""
        return self.mode != "always"

    def sight(self, keys: Sequence[bytes]) -> list[bool]:
        """Book one prompt's chunk keys; per key, whether an earlier prompt held it (nothing
        is booked, and nothing returned, under ``always``)."""
        return self.sightings.sight(keys) if self.books else []

    def admitted(self, chunks: range, repeats: Sequence[bool] | None) -> Sequence[int]:
        """The chunks of ``chunks`` to store, given their prompt's :meth:`sight` (None: never
        sighted, so none repeats)."""
        if self.mode == "always" or (self.mode == "auto" and self.sightings.repeating):
            return chunks
        repeats = repeats or ()
        return [c for c in chunks if c < len(repeats) and repeats[c]]


__all__ = ["ADMIT_MODES", "Sightings", "StoreAdmission"]
