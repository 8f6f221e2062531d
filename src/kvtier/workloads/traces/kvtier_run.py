"""The per-request records of a ``kvtier run --engine vllm --json`` report, as a trace to replay.

The report (schema ``kvtier.run.vllm/1``) holds one phase per system (``vllm``, then
``vllm+kvtier``), each with its requests: session, kind, turn, when it was due and sent, prompt
and output lengths, the prompt's chained chunk keys (``block_hashes``, hex, one per *full*
``chunk_tokens``-token chunk) and what the run measured. A request's ``blocks`` are those keys
as bytes (``bytes.fromhex``), so equal prompt prefixes keep equal keys; a prompt whose length is
not a multiple of the chunk size gets one more, partial block, keyed from the last full chunk's
key and the prompt's own hash (equal only for equal prompts).

``after_s`` (closed-loop replay) is how long after the previous turn of the same session ended
(its ``sent_s + e2e_s``) this one was due, at least 0; ``None`` for a first turn or when the
previous turn has no timings. :class:`RunMeta` carries what a simulator needs from the run
beside the requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from kvtier.errors import ConfigError
from kvtier.workloads.requests import ROOT, TraceRequest
from kvtier.workloads.traces.lines import BadLine, integer, number, open_text

TIME_UNIT_S = 1.0
MEASURED = ("ttft_s", "e2e_s", "cached_tokens", "hit_tokens", "load_wait_s", "sent_s")
PREFILL_FIELDS = ("a_s", "b_s_per_token", "c_s_per_token2")


@dataclass(frozen=True)
class RunMeta:
    """What a ``kvtier run`` report says about the serving set-up of one phase.

    ``engine``: the measured speed (``a_s``, ``b_s_per_token``, ``c_s_per_token2`` of the prefill
    fit, ``decode_step_s``); ``tiers``: (name, bytes) of kvtier's tiers, empty when the phase ran
    without kvtier; ``metrics``: the phase's vLLM ``/metrics`` counters, after minus before.
    """

    system: str
    concurrency: int
    pool_blocks: int
    max_model_len: int
    chunk_tokens: int
    engine: Mapping[str, float]
    tiers: tuple[tuple[str, int], ...] = ()
    kv_bytes_per_token: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    key_tokens: int = 0

    @property
    def block_tokens(self) -> int:
        """Tokens per recorded key: the engine's block where the run recorded those, else the
        chunk."""
        return self.key_tokens or self.chunk_tokens


def read_kvtier_run(
    path: str | Path,
    *,
    system: str | None = None,
    block_tokens: int | None = None,
    time_unit_s: float = TIME_UNIT_S,
    skip_bad: bool = False,
) -> tuple[list[TraceRequest], int, RunMeta]:
    """The requests of one phase of a run report (``system``; default the first phase), sorted
    by due time, the count of bad request records skipped, and the phase's :class:`RunMeta`.

    ``block_tokens``, when given, must equal the report's chunk size (the keys cannot be cut
    into other blocks).
    """
    text = "".join(open_text(path))
    try:
        report = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{path}:{e.lineno}: not a JSON run report ({e.msg})") from None
    where = str(path)
    if not isinstance(report, dict) or not isinstance(report.get("phases"), list):
        raise ConfigError(f"{where}: not a `kvtier run --json` report (it has no 'phases' list)")
    phases = [p for p in report["phases"] if isinstance(p, dict)]
    names = [str(p.get("system")) for p in phases]
    if not phases:
        raise ConfigError(f"{where}: the run report has no phases")
    if system is None:
        phase = phases[0]
    elif system in names:
        phase = phases[names.index(system)]
    else:
        raise ConfigError(f"{where}: no phase '{system}' in the run; it has {', '.join(names)}")
    meta = _meta(report, phase, where)
    if block_tokens is not None and block_tokens != meta.block_tokens:
        raise ConfigError(
            f"{where}: the run's keys are of {meta.block_tokens}-token blocks; "
            f"block_tokens {block_tokens} cannot be read from them"
        )
    records = phase.get("requests")
    if not isinstance(records, list):
        raise ConfigError(f"{where}: phase '{meta.system}' has no 'requests' list")
    parsed: list[tuple[dict[str, Any], float, int]] = []
    skipped = 0
    for i, record in enumerate(records):
        try:
            if not isinstance(record, dict):
                raise BadLine("a request record must be a JSON object")
            due = number(record, "due_s") * time_unit_s
            _check(record, meta.block_tokens)
        except BadLine as e:
            if not skip_bad:
                raise ConfigError(
                    f"{where}: phase '{meta.system}', request {i}: {e} (skip_bad skips it)"
                ) from None
            skipped += 1
            continue
        parsed.append((record, due, i))
    return _requests(parsed, meta.block_tokens, time_unit_s), skipped, meta


def _check(record: dict[str, Any], chunk: int) -> None:
    n_in = integer(record, "prompt_tokens", low=1)
    integer(record, "output_tokens")
    integer(record, "turn")
    for name in ("session", "kind"):
        if type(record.get(name)) is not str:
            raise BadLine(f"field '{name}' must be a string, got {record.get(name)!r}")
    keys = record.get("block_hashes")
    if type(keys) is not list or not all(type(k) is str for k in keys):
        raise BadLine("field 'block_hashes' must be a list of hex strings")
    if len(keys) != n_in // chunk:
        raise BadLine(
            f"{len(keys)} block hashes, but a {n_in}-token prompt has {n_in // chunk} "
            f"full {chunk}-token chunks"
        )
    try:
        [bytes.fromhex(k) for k in keys]
    except ValueError:
        raise BadLine("field 'block_hashes' holds a string that is not hex") from None


def _requests(
    parsed: list[tuple[dict[str, Any], float, int]], chunk: int, unit: float
) -> list[TraceRequest]:
    ended: dict[str, float | None] = {}  # session -> when its latest turn ended (s)
    out: list[tuple[float, int, TraceRequest]] = []
    for record, due, index in sorted(parsed, key=lambda p: (p[0]["session"], p[0]["turn"], p[1])):
        session = record["session"]
        n_in = record["prompt_tokens"]
        blocks = tuple(bytes.fromhex(k) for k in record["block_hashes"])
        if n_in % chunk:
            tail = str(record.get("prompt_hash", n_in)).encode()
            blocks += (xxhash.xxh3_128_digest((blocks[-1] if blocks else ROOT) + b"/" + tail),)
        end = ended.get(session)
        after = None if end is None else max(0.0, due - end)
        sent, e2e = record.get("sent_s"), record.get("e2e_s")
        timed = type(sent) in (int, float) and type(e2e) in (int, float)
        ended[session] = (sent + e2e) * unit if timed else None
        request = TraceRequest(
            due,
            n_in,
            record["output_tokens"],
            blocks,
            chunk,
            session=session,
            turn=record["turn"],
            kind=record["kind"],
            after_s=after,
            measured={k: record.get(k) for k in MEASURED},
        )
        out.append((due, index, request))
    return [r for _, _, r in sorted(out, key=lambda t: (t[0], t[1]))]


def _meta(report: dict[str, Any], phase: dict[str, Any], where: str) -> RunMeta:
    config = _dict(report.get("config"))
    server = _dict(phase.get("server"))
    tiers_section = _dict(report.get("tiers"))
    engine_section = _dict(report.get("engine")) or _dict(phase.get("warmup"))
    prefill = _dict(engine_section.get("prefill"))
    engine = {k: prefill.get(k) for k in PREFILL_FIELDS}
    engine["decode_step_s"] = engine_section.get("decode_step_s")
    system = str(phase.get("system"))
    key = config.get("record_block_tokens")
    values = {
        "concurrency": config.get("concurrency"),
        "pool_blocks": server.get("pool_blocks", config.get("pool_blocks")),
        "max_model_len": server.get("max_model_len", config.get("max_model_len")),
        "chunk_tokens": tiers_section.get("chunk_tokens", config.get("chunk_tokens")),
    }
    bad = [k for k, v in values.items() if type(v) is not int or v < 1]
    bad += [k for k, v in engine.items() if type(v) not in (int, float) or v < 0]
    if bad:
        raise ConfigError(f"{where}: the run report lacks usable {', '.join(bad)}")
    tiers: tuple[tuple[str, int], ...] = ()
    if "kvtier" in system:
        tiers = tuple(
            (str(t.get("name")), int(t.get("bytes", 0)))
            for t in tiers_section.get("tiers", [])
            if isinstance(t, dict)
        )
    model = _dict(report.get("model"))
    kv = model.get("kv_bytes_per_token")
    metrics = {
        str(k): float(v)
        for k, v in _dict(phase.get("metrics_delta")).items()
        if type(v) in (int, float)
    }
    return RunMeta(
        system=system,
        engine={k: float(v) for k, v in engine.items()},
        tiers=tiers,
        kv_bytes_per_token=kv if type(kv) is int else None,
        metrics=metrics,
        key_tokens=key if type(key) is int and key > 0 else 0,
        **values,
    )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


__all__ = ["MEASURED", "TIME_UNIT_S", "RunMeta", "read_kvtier_run"]
