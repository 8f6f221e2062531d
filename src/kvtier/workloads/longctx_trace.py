"""The long-context workload of ``kvtier run`` (:mod:`~kvtier.workloads.longctx`) as
:class:`~kvtier.workloads.requests.TraceRequest` lists, so the simulator replays the very
workload a live run sends.

The sessions are built and played with placeholder answers (:func:`~kvtier.workloads.longctx.
dry_run`); each prompt's token ids are cut into ``block_tokens``-token blocks (the last one
partial), each block named by the xxh3-128 digest of its ids and the names chained
(:func:`~kvtier.workloads.requests.chain_keys`): equal token prefixes give equal keys.

A first turn arrives at its session's start plus its delay. A later turn is sent ``after_s`` =
its delay (think time, tool call) after the previous answer; its ``arrival_s`` is the earliest
it could come (the previous turn's arrival plus that delay, as if answers took no time), which
only orders it: a closed-loop replay goes by ``after_s``.
"""

from __future__ import annotations

import numpy as np
import xxhash

from kvtier.errors import ConfigError
from kvtier.workloads.longctx import LongContextSpec, build_sessions, dry_run
from kvtier.workloads.requests import TraceRequest, chain_keys

NAMESPACE = b"longctx"


def token_block_keys(
    tokens: list[int], block_tokens: int, namespace: bytes = NAMESPACE
) -> tuple[bytes, ...]:
    """Chained keys of the ``block_tokens``-token blocks of ``tokens`` (the last one partial)."""
    if block_tokens < 1:
        raise ConfigError(f"block_tokens must be at least 1, got {block_tokens}")
    raw = np.asarray(tokens, dtype="<i8").tobytes()
    step = 8 * block_tokens
    names = (xxhash.xxh3_128_hexdigest(raw[i : i + step]) for i in range(0, len(raw), step))
    return chain_keys(names, namespace)


def longctx_requests(
    spec: LongContextSpec, *, block_tokens: int = 256, namespace: bytes = NAMESPACE
) -> list[TraceRequest]:
    """Every request of the workload ``spec`` describes, sorted by arrival (stable)."""
    out: list[TraceRequest] = []
    last: dict[str, float] = {}
    for session, step in dry_run(build_sessions(spec)):
        if step.index == 0:
            arrival, after = session.arrival_s + step.delay_s, None
        else:
            arrival, after = last[session.name] + step.delay_s, step.delay_s
        last[session.name] = arrival
        out.append(
            TraceRequest(
                arrival,
                len(step.prompt),
                step.max_tokens,
                token_block_keys(step.prompt, block_tokens, namespace),
                block_tokens,
                session=session.name,
                turn=step.index,
                kind=session.kind,
                after_s=after,
            )
        )
    return sorted(out, key=lambda r: r.arrival_s)


__all__ = ["NAMESPACE", "longctx_requests", "token_block_keys"]
