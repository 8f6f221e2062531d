"""A request inside the simulator: the trace's request plus its engine state and its record."""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from kvtier.errors import ConfigError
from kvtier.workloads.requests import TraceRequest


def engine_keys(trace: TraceRequest, block_tokens: int) -> list[bytes]:
    """One chained key per full ``block_tokens``-token engine block the trace names.

    Trace blocks of T tokens map onto engine blocks of B tokens: when B is a multiple of T, an
    engine block takes the key of the last trace block it covers (a chained key names the whole
    prefix up to it); when T is a multiple of B, engine block j takes the key of the trace block
    holding it plus j's place inside that block. Only blocks wholly inside the prompt and
    inside the trace's named blocks get a key; the rest are the request's own.
    """
    t, b = trace.block_tokens, block_tokens
    full = trace.input_tokens // b
    keys = trace.blocks
    if b == t:
        return list(keys[:full])
    if b % t == 0:
        per = b // t
        return [keys[(j + 1) * per - 1] for j in range(full) if (j + 1) * per - 1 < len(keys)]
    if t % b == 0:
        per = t // b
        out = []
        for j in range(full):
            i = j // per
            if i >= len(keys):
                break
            out.append(keys[i] + (j % per).to_bytes(2, "little"))
        return out
    raise ConfigError(
        f"the trace's {t}-token blocks and the engine's {b}-token blocks do not nest; "
        "choose a block size that divides or is a multiple of the trace's"
    )


@dataclass(eq=False)
class SimRequest:
    """A request's state in one replica, and what the report needs of it."""

    rid: int
    trace: TraceRequest
    keys: list[bytes]
    due_s: float
    output: int
    sent_s: float = 0.0
    arrived_s: float = 0.0
    replica: int = 0
    computed: int = 0
    generated: int = 0
    blocks: list[int] = field(default_factory=list)
    state: str = "new"
    registered: int = 0
    stored_chunks: int = 0
    most_computed: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    load_started_s: float | None = None
    load_wait_s: float = 0.0
    hit_tokens: dict[str, int] = field(default_factory=dict)
    computed_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    preload_pending: int = 0
    decision: str = ""
    prompt: int = 0
    repeats: list[bool] | None = None  # per prompt chunk: an earlier prompt held it (admit)

    def __post_init__(self) -> None:
        self.prompt = self.trace.input_tokens

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV the next sample needs: the prompt and what was generated so far."""
        return self.trace.input_tokens + self.generated

    def key(self, j: int) -> bytes:
        """The key of engine block ``j``: the trace's where it names one, else the request's own."""
        if j < len(self.keys):
            return self.keys[j]
        own = b"own" + self.rid.to_bytes(8, "little") + j.to_bytes(4, "little")
        return xxhash.xxh3_128_digest(own)


__all__ = ["SimRequest", "engine_keys"]
