#!/usr/bin/env python3
"""Render the ``--json`` reports in ``docs/benchmarks/data/`` into the pages beside them.

    scripts/measurements.py storage REPORT.json [REPORT.json …] --out docs/benchmarks/storage.md
    scripts/measurements.py codec REPORT.json [REPORT.json …] --out docs/benchmarks/codec-tiers.md
    scripts/measurements.py run REPORT.json [REPORT.json …] --out docs/benchmarks/run.md
    scripts/measurements.py serve REPORT.json [REPORT.json …] --out docs/benchmarks/serve.md
    scripts/measurements.py fleet REPORT.json [REPORT.json …] --out docs/benchmarks/sim-fleet.md
    scripts/measurements.py peers REPORT.json [REPORT.json …] --out docs/benchmarks/peers.md
    scripts/measurements.py ab --before B.json … --after A.json … --out A-B.md

``storage`` tabulates `kvtier bench storage` reports: kvtier ÷ reference per block size, tier,
operation and depth, the median over the runs given and their range, with the target and the
verdict of the median. ``codec`` takes `kvtier bench storage` reports of coded tiers (two tiers of
one run whose URLs differ only in ``codec=``, or a tier against its raw twin, ``--reference
raw``), `kvtier bench codec` reports and `kvtier run --disk-codec` reports. ``run`` takes `kvtier
run --json` reports, ``serve`` `kvtier bench serve --json` reports and those of
``scripts/connector_overhead.py`` and ``scripts/dram_prefix_ttft.py``, ``fleet`` `kvtier
simulate --sweep replicas=… --sweep routing=… --json` reports. ``ab`` compares two
versions of the code measured in one session (runs alternating): per cell the median and range
of each, whether the new median is at least 0.95 × the old one or inside the old range, and
whether a target the old code met is still met.

Figures come only from the reports. Every page ends with where they come from: per report the
day it was measured (UTC), the CPU and the command. A report that does not record these itself
(`kvtier bench storage --json` records the CPU but not the day or the command) takes them from
``measured.toml`` in its folder::

    [[runs]]
    files = ["kv-r*.json"]          # names or patterns of reports in this folder
    measured = "2026-12-02"         # the day they were measured (UTC)
    command = "kvtier bench storage --payload kv … --json"
    cpu = "…"                       # optional: the CPU, where a report names none or less
    note = "…"                      # optional: what else a reader needs (servers, versions)
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import statistics
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

Cell = tuple[int, str, str, int]  # block bytes, tier scheme, op, depth


@dataclass(frozen=True)
class Report:
    """One report and what is known of how it was made."""

    path: Path
    doc: dict
    kind: str  # storage, codec, run, serve, overhead, prefix-ttft, fleet, reload, peers, transfer
    measured: str | None
    command: str | None
    cpu: str | None
    note: str | None


def kind_of(doc: dict) -> str | None:
    """Which report ``doc`` is."""
    schema = str(doc.get("schema") or "")
    if doc.get("benchmark") == "storage":
        return "storage"
    if schema.startswith("kvtier.run"):
        return "run"
    if schema.startswith("kvtier.bench.serve"):
        return "serve"
    if {"results", "against", "cores"} <= doc.keys():
        return "codec"
    if {"systems", "rounds", "throughput_vs_engine_cpu_r"} <= doc.keys():
        return "overhead"
    if {"prefix_tokens", "ratio_median"} <= doc.keys():
        return "prefix-ttft"
    if {"config", "sweep", "series", "rows"} <= doc.keys():
        return "fleet"
    if schema.startswith("kvtier.bench.reload"):
        return "reload"
    if schema.startswith("kvtier.bench.peers"):
        return "peers"
    if schema.startswith("kvtier.bench.transfer"):
        return "transfer"
    return None


@cache
def sidecar(folder: Path) -> tuple[dict, ...]:
    """The ``[[runs]]`` of ``folder/measured.toml`` (none if there is no such file)."""
    path = folder / "measured.toml"
    if not path.exists():
        return ()
    try:
        return tuple(tomllib.loads(path.read_text()).get("runs", []))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        sys.exit(f"measurements: cannot read {path}: {exc}")


def report_cpu(doc: dict, kind: str) -> str | None:
    """``2 × <CPU>`` as the report records it."""
    if kind in ("storage", "serve", "reload", "peers"):
        env = doc.get("environment", {})
        count, cpu = env.get("cpus"), env.get("cpu")
    elif kind == "run":
        count, cpu = doc.get("machine", {}).get("cpus"), doc.get("machine", {}).get("cpu")
    elif kind == "codec":
        count, cpu = doc.get("cores"), doc.get("cpu")
    elif kind == "transfer":
        count, cpu = None, doc.get("device_name")
    else:
        count, cpu = None, doc.get("cpu")
    if not cpu:
        return None
    return f"{count} × {cpu}" if count else str(cpu)


def load(paths: list[str], kinds: set[str]) -> list[Report]:
    """The reports in ``paths`` (one ``--json`` document each), which must be of ``kinds``."""
    reports = []
    for name in paths:
        path = Path(name)
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            sys.exit(f"measurements: cannot read {path}: {exc}")
        kind = kind_of(doc)
        if kind not in kinds:
            sys.exit(f"measurements: {path} is a {kind or 'unknown'} report, not {'/'.join(kinds)}")
        entry = next(
            (
                run
                for run in sidecar(path.resolve().parent)
                if any(fnmatch.fnmatch(path.name, p) for p in run.get("files", []))
            ),
            {},
        )
        measured = doc.get("date") or doc.get("measured") or entry.get("measured")
        reports.append(
            Report(
                path=path,
                doc=doc,
                kind=kind,
                measured=str(measured) if measured else None,
                command=doc.get("command") or entry.get("command"),
                cpu=entry.get("cpu") or report_cpu(doc, kind),
                note=entry.get("note"),
            )
        )
    return reports


def provenance(reports: list[Report], base: Path) -> list[str]:
    """The page's last section: per CPU, each set of reports with the day it was measured and
    the command; then what else a reader needs to know of them."""
    by_cpu: dict[str, dict[tuple[str, str], list[Report]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        by_cpu[r.cpu or "CPU not recorded"][(r.measured or "", r.command or "")].append(r)
    out = [
        "## Measured",
        "",
        "The day each set of reports was measured (UTC), its command, the reports.",
        "",
    ]
    for cpu, groups in by_cpu.items():
        out += [f"On {cpu}:", ""]
        ordered = sorted(groups.items(), key=lambda g: (g[0][0], natural(g[1][0].path)))
        for (day, command), group in ordered:
            group = sorted(group, key=lambda r: natural(r.path))
            files = ", ".join(f"`{shown(r.path, base)}`" for r in group)
            what = f"`{command}`" if command else "command not recorded"
            out.append(f"- {day or 'day not recorded'}: {what}: {files}.")
        notes = list(dict.fromkeys(r.note for _, g in ordered for r in g if r.note))
        out += ["", *(f"{n}." for n in notes), *([""] if notes else [])]
    return out


def natural(path: Path) -> list:
    """A sort key that puts ``r9`` before ``r10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def shown(path: Path, base: Path) -> str:
    """``path`` as a page names it: relative to ``docs/benchmarks/`` (where the pages are) when it
    lies under it, so a page renders the same wherever ``--out`` puts it; else relative to
    ``base``."""
    try:
        return path.resolve().relative_to(PAGES).as_posix()
    except ValueError:
        return os.path.relpath(path, base)


def storage_cells(docs: list[dict], field: str = "ratio") -> tuple[dict[Cell, list[float]], dict]:
    """Per cell over the runs: the ratios (``field="ratio"``), kvtier's GB/s (``"gbps"``) or the
    reference's (``"ref"``); and each cell's target."""
    values: dict[Cell, list[float]] = defaultdict(list)
    targets: dict[Cell, float | None] = {}
    for doc in docs:
        for row in doc["results"]:
            if row.get("ratio") is None:
                continue
            scheme = row["url"].split("://", 1)[0]
            cell = (row["block_bytes"], scheme, row["op"], row["depth"])
            value = row["reference"]["gbps"] if field == "ref" else row[field]
            values[cell].append(value)
            targets[cell] = row.get("target")
    return values, targets


def size_text(n: int) -> str:
    """``262144`` → ``256 KiB``; ``5898240`` → ``5.6 MiB``."""
    if n >= 1 << 20:
        mib = n / (1 << 20)
        return f"{mib:.0f} MiB" if mib == int(mib) else f"{mib:.1f} MiB"
    return f"{n / 1024:.0f} KiB"


def span(values: list[float], digits: int = 2) -> str:
    """``median (min–max)`` of a cell's values."""
    med = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def verdict(values: list[float], target: float | None) -> str:
    """The target and whether the median meets it."""
    if target is None:
        return ""
    return f"{target} {'PASS' if statistics.median(values) >= target else 'MISS'}"


def machine(docs: list[dict]) -> str:
    """One line naming the machine the storage runs were measured on."""
    env = docs[0].get("environment", {})
    cpu = env.get("cpu") or "CPU not recorded"
    fs = env.get("filesystem")
    disk = f"; disk tiers on {fs}" if fs else ""
    return f"{env.get('cpus', '?')} × {cpu}{disk}; fio {env.get('fio') or 'none'}"


def render_storage(reports: list[Report]) -> list[str]:
    """The page of ``storage``."""
    docs = [r.doc for r in reports]
    ratios, targets = storage_cells(docs)
    shared = any(c[1] in ("redis", "s3") for c in ratios)
    out = [
        "# Shared tiers: kvtier ÷ raw client" if shared else "# Storage: kvtier ÷ reference",
        "",
        f"From {len(docs)} `kvtier bench storage --json` reports; machine: {machine(docs)}.",
        "Each cell: median kvtier ÷ reference over the runs (their range); the reference is "
        + (
            "the raw client (redis-py as it comes, obstore)"
            if shared
            else "fio with the tier's engine and layout for disk tiers, a plain copy for memory"
        )
        + ". Target and verdict of the median where a target applies (blocks ≥ 256 KiB).",
        "",
    ]
    for block in sorted({c[0] for c in ratios}):
        out += [f"## {size_text(block)} blocks", "", "| tier | op | depth | ratio | target |"]
        out.append("| --- | --- | --- | --- | --- |")
        for cell in sorted(c for c in ratios if c[0] == block):
            _, scheme, op, depth = cell
            mark = verdict(ratios[cell], targets.get(cell))
            out.append(f"| {scheme}:// | {op} | {depth} | {span(ratios[cell])} | {mark} |")
        out.append("")
    return out


def render_ab(before: list[Report], after: list[Report]) -> list[str]:
    """The page of ``ab``."""
    old, targets = storage_cells([r.doc for r in before])
    new, _ = storage_cells([r.doc for r in after])
    out = [
        "# Storage A/B: the code before and after, in one session",
        "",
        f"{len(before)} reports before, {len(after)} after, alternating; machine: "
        f"{machine([r.doc for r in after])}.",
        "A cell holds when the new median is ≥ 0.95 × the old median or inside the old range;",
        "a target the old median met must still be met by the new one.",
        "",
        "GB/s columns: kvtier's own rate and the reference's (medians), before → after.",
        "",
        "| block | tier | op | depth | before | after | new/old | holds | target "
        "| kvtier GB/s | reference GB/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rate = {
        code: (storage_cells(docs, "gbps")[0], storage_cells(docs, "ref")[0])
        for code, docs in (("before", [r.doc for r in before]), ("after", [r.doc for r in after]))
    }
    failed = 0
    for cell in sorted(set(old) & set(new)):
        block, scheme, op, depth = cell
        o, n = statistics.median(old[cell]), statistics.median(new[cell])
        holds = n >= 0.95 * o or min(old[cell]) <= n <= max(old[cell])
        target = targets.get(cell)
        kept = target is None or o < target or n >= target
        failed += not (holds and kept)
        mark = "" if target is None else ("kept" if kept else "**lost**")
        kv = [statistics.median(rate[c][0][cell]) for c in ("before", "after")]
        ref = [statistics.median(rate[c][1][cell]) for c in ("before", "after")]
        out.append(
            f"| {size_text(block)} | {scheme}:// | {op} | {depth} | {span(old[cell])} | "
            f"{span(new[cell])} | {n / o:.2f} | {'yes' if holds else '**no**'} | {mark} | "
            f"{kv[0]:.2f} → {kv[1]:.2f} | {ref[0]:.2f} → {ref[1]:.2f} |"
        )
    out += ["", f"Cells that do not hold: {failed}.", ""]
    return out


Cells = dict[tuple[str, str, str, int], list[float]]


def codec_pairs(docs: list[dict]) -> tuple[Cells, Cells]:
    """Per (payload, tier scheme, op, depth), over the runs: coded ÷ raw, each ratio from the
    two tiers of one run whose URLs differ only in ``codec=`` (``kv`` against ``raw``); and the
    same with each tier first divided by its own reference (fio or a memory copy, run in turns
    with that tier's passes), where both have one: that takes out the machine's drift between
    the two tiers' turns."""
    plain: Cells = defaultdict(list)
    fair: Cells = defaultdict(list)
    for doc in docs:
        payload = doc.get("config", {}).get("payload", "random")
        rates: dict[tuple[str, str, int], dict[str, tuple[float, float | None]]] = defaultdict(dict)
        for r in doc["results"]:
            if (r.get("reference") or {}).get("kind") == "raw":
                continue  # a raw twin's row: see codec_twins
            scheme, _, rest = r["url"].partition("://")
            query = rest.partition("?")[2].split("&")
            codec = next((q[6:] for q in query if q.startswith("codec=")), None)
            # the same tier but for codec= (a disk tier's folder may differ)
            tier = scheme + "?" + "&".join(q for q in query if not q.startswith("codec="))
            if codec in ("kv", "raw"):
                rates[(tier, r["op"], r["depth"])][codec] = (r["gbps"], r.get("ratio"))
        for (tier, op, depth), by in rates.items():
            if "kv" in by and "raw" in by and by["raw"][0]:
                cell = (payload, tier.split("?")[0], op, depth)
                plain[cell].append(by["kv"][0] / by["raw"][0])
                if by["kv"][1] and by["raw"][1]:
                    fair[cell].append(by["kv"][1] / by["raw"][1])
    return plain, fair


def codec_twins(docs: list[dict]) -> tuple[Cells, Cells, Cells, dict]:
    """Per (payload, tier scheme, op, depth), over the runs of ``--reference raw``: coded ÷ raw
    twin, the coded tier's GB/s and the twin's; ``op`` is also ``store+load`` (a write and a
    read of the same blocks timed together); and each cell's target."""
    ratio: Cells = defaultdict(list)
    coded: Cells = defaultdict(list)
    raw: Cells = defaultdict(list)
    targets: dict = {}
    for doc in docs:
        payload = doc.get("config", {}).get("payload", "random")
        rows = [
            (
                r["url"].split("://", 1)[0],
                r["op"],
                r["depth"],
                r["ratio"],
                r["gbps"],
                r["reference"]["gbps"],
                r.get("target"),
            )
            for r in doc["results"]
            if (r.get("reference") or {}).get("kind") == "raw" and r.get("ratio") is not None
        ]
        rows += [
            (
                t["tier"],
                "store+load",
                t["depth"],
                t["ratio"],
                t["gbps"],
                t["reference_gbps"],
                t.get("target"),
            )
            for t in doc.get("round_trips") or []
            if t.get("ratio") is not None
        ]
        for scheme, op, depth, r, mine, theirs, target in rows:
            cell = (payload, scheme, op, depth)
            ratio[cell].append(r)
            coded[cell].append(mine)
            raw[cell].append(theirs)
            targets[cell] = target
    return ratio, coded, raw, targets


OP_ORDER = {"write": 0, "read": 1, "store+load": 2}
CORPORA = ["real-bf16", "real-fp16", "synthetic-bf16", "uniform-fp16", "random-bytes"]
METHODS = ["zstd-1", "zstd-3", "byteplane+zstd-1", "zipnn", "kvtier-kv"]


def render_codec_bench(docs: list[dict]) -> list[str]:
    """`kvtier bench codec` reports: ratio per corpus and method, then speeds on real KV."""
    ratio: Cells = defaultdict(list)
    speed: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for doc in docs:
        for r in doc["results"]:
            ratio[(r["corpus"], r["method"])].append(r["ratio"])
            for f in ("encode_gbps_core", "decode_gbps_core", "encode_gbps_all", "decode_gbps_all"):
                speed[(r["corpus"], r["method"], f)].append(r[f])
    corpora = [c for c in CORPORA if any(k[0] == c for k in ratio)]
    methods = [m for m in METHODS if any(k[1] == m for k in ratio)]
    runs = f"{len(docs)} run{'s' if len(docs) > 1 else ''}"
    out = [
        "## `kvtier bench codec`",
        "",
        f"Every method on the same 256-token chunks ({runs}; median, with the range where the runs",
        "differ). Ratio: raw ÷ stored bytes per corpus.",
        "",
        "| corpus | " + " | ".join(methods) + " |",
        "| --- |" + " ---: |" * len(methods),
    ]
    for c in corpora:
        out.append(f"| {c} | " + " | ".join(span(ratio[(c, m)], 3) for m in methods) + " |")
    out += [
        "",
        "GB/s of raw bytes, on one core and on all cores:",
        "",
        "| corpus | method | encode, one core | decode, one core | encode, all cores "
        "| decode, all cores |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in [c for c in corpora if c.startswith("real")]:
        for m in methods:
            cols = ("encode_gbps_core", "decode_gbps_core", "encode_gbps_all", "decode_gbps_all")
            out.append(f"| {c} | {m} | " + " | ".join(span(speed[(c, m, f)]) for f in cols) + " |")
    return [*out, ""]


def render_codec(reports: list[Report]) -> list[str]:
    """The page of ``codec``: coded tiers, the codec bench, `kvtier run --disk-codec`."""
    storage = [r.doc for r in reports if r.kind == "storage"]
    cpus = sorted({r.cpu or "CPU not recorded" for r in reports})
    disks = [d for d in storage if d.get("environment", {}).get("filesystem")]
    out = [
        "# Coded tiers: `codec=kv` against `codec=raw`",
        "",
        f"From {len(reports)} reports; CPU: {'; '.join(cpus)}."
        + (f" {machine(disks or storage).split('; ', 1)[1].capitalize()}." if storage else ""),
        "",
    ]
    plain, fair = codec_pairs(storage)
    if plain:
        out += [
            "## Two tiers in one run",
            "",
            "Each cell: raw bytes delivered per second by a tier with `codec=kv` over the same",
            "tier with `codec=raw`, measured one after the other in the same run on the same",
            "blocks; median over the runs (their range). `random`: random bytes in the KV",
            "layout (the codec must cost nothing); `kv`: real KV chunks of the embedded model",
            "(what the codec buys). The last column: each tier's rate first divided by its own",
            "reference, run in turns with that tier's passes (fio's reads and writes of raw",
            "blocks for a disk tier, where the run had fio; a memory copy for `memory://`), so the",
            "machine's drift between the two tiers' turns cancels.",
            "",
            "| payload | tier | op | depth | kv ÷ raw | kv ÷ raw, each over its reference |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for cell in sorted(plain):
            payload, scheme, op, depth = cell
            over = span(fair[cell]) if fair.get(cell) else "—"
            out.append(
                f"| {payload} | {scheme}:// | {op} | {depth} | {span(plain[cell])} | {over} |"
            )
        out.append("")
    ratio, coded, raw, targets = codec_twins(storage)
    if ratio:
        out += [
            "## Against the raw twin (`--reference raw`)",
            "",
            "Each cell: a tier with `codec=kv` over its raw twin (the same tier at `codec=raw`, a",
            "namespace of its own, the two taking turns slice by slice on the same blocks), in raw",
            "bytes delivered per second; `store+load`: a write and a read of the same blocks timed",
            "together. Median over the runs (their range); GB/s of raw bytes, medians. `random`:",
            "random bytes, which the codec stores raw (the target: within 5 % of the twin); `kv`:",
            "real KV chunks of the embedded model (the target: reads ≥ 1.25× the twin's).",
            "",
            "| payload | tier | op | depth | coded ÷ raw twin | target | coded GB/s "
            "| raw twin GB/s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for cell in sorted(ratio, key=lambda c: (c[0], c[1], OP_ORDER.get(c[2], 9), c[3])):
            payload, scheme, op, depth = cell
            out.append(
                f"| {payload} | {scheme}:// | {op} | {depth} | {span(ratio[cell])} | "
                f"{verdict(ratio[cell], targets.get(cell))} | "
                f"{statistics.median(coded[cell]):.2f} | {statistics.median(raw[cell]):.2f} |"
            )
        out.append("")
    bench = [r.doc for r in reports if r.kind == "codec"]
    if bench:
        out += render_codec_bench(bench)
    for r in reports:
        if r.kind == "run":
            out += render_one_run(r)
    return out


def tokens(n: float | None) -> str:
    return "—" if n is None else f"{n:,.0f}"


def per_tier(counts: dict | None) -> str:
    return ", ".join(f"{k} {v:,.0f}" for k, v in (counts or {}).items() if v) or "—"


def render_one_run(r: Report) -> list[str]:
    """One `kvtier run --json` report: its phases side by side."""
    doc = r.doc
    summary = doc["summary"]
    systems = summary["systems"]
    first = next(iter(systems.values()))
    cfg = doc.get("config", {})
    out = [
        f"## `{r.path.stem}`: {first['requests']} requests, "
        f"{first['prompt_tokens']:,} prompt tokens"
        + (
            f", `--disk-codec {cfg['disk_codec']}`" if cfg.get("disk_codec", "raw") != "raw" else ""
        ),
        "",
        f"CPU: {r.cpu or 'not recorded'}; concurrency "
        f"{cfg.get('concurrency', '?')}, {doc.get('wall_s', 0):.0f} s in all. Per phase: TTFT,"
        " the prompt tokens the engine computed, the tokens each store served, those that"
        " failed to load (computed instead) and what kvtier's tiers held at the end.",
        "",
        "| phase | TTFT p50 | TTFT p95 | computed | hit fraction | hits per store | failed to load "
        "| held at the end |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for name, s in systems.items():
        out.append(
            f"| {name} | {s['ttft_p50_s']:.2f} s | {s['ttft_p95_s']:.2f} s | "
            f"{tokens(s.get('computed_tokens'))} | {s.get('hit_fraction', 0):.2f} | "
            f"{per_tier(s.get('hit_tokens'))} | {tokens(s.get('unloaded_tokens'))} | "
            f"{per_tier(s.get('held_tokens'))} |"
        )
    codec = summary.get("codec")
    if codec:
        held = codec["disk_tokens_held"]
        out += [
            "",
            f"The same disk tier held {held['kv']:,} tokens coded against {held['raw']:,} raw "
            f"(**{codec['disk_tokens_held_ratio']:.2f}×**).",
        ]
    compare = summary.get("compare")
    if compare and compare.get("answers"):
        a = compare["answers"]
        out += ["", f"Greedy answers the same as vLLM alone's on {a['same']} of {a['compared']}."]
    return [*out, ""]


def render_run(reports: list[Report]) -> list[str]:
    """The page of ``run``."""
    out = ["# The main job: `kvtier run`", ""]
    for r in reports:
        out += render_one_run(r)
    return out


def workload_shape(prefix: dict) -> str:
    """The reuse workload of a `kvtier bench serve` report, with its shape."""
    trace = prefix.get("trace")
    if trace:
        reused = trace.get("reused_share")
        return (
            f"Mooncake trace, {trace['requests']} requests from line {trace['start']:,} "
            f"({trace['block_tokens']} tokens a hash block, median input "
            f"{trace.get('median_input', 0):,} tokens"
            + ("" if reused is None else f", {100 * reused:.0f} % of blocks reused")
            + ")"
        )
    if not prefix:
        return "`prefix_repetition`"
    if prefix.get("sessions"):
        n, turns = prefix["num_prefixes"], prefix["prompts"] // max(1, prefix["num_prefixes"])
        return (
            f"Multi-turn sessions ({n} × {turns} turns, {prefix['prefix_tokens']:,}-token "
            f"openings, {prefix['suffix_tokens']:,} tokens a turn)"
        )
    return (
        f"`prefix_repetition` ({prefix['num_prefixes']} prefixes of "
        f"{prefix['prefix_tokens']:,} tokens, {prefix['prompts']} prompts)"
    )


def serve_title(doc: dict) -> str:
    """What a `kvtier bench serve` report measured, in a few words."""
    cfg = doc.get("config", {})
    systems = cfg.get("systems") or sorted({run["system"] for run in doc.get("runs", [])})
    workload = workload_shape(cfg.get("prefix") or {})
    conc = ", ".join(str(c) for c in cfg.get("concurrency", []))
    title = f"{workload}: {', '.join(systems)} at concurrency {conc}"
    if (cfg.get("tensor_parallel") or 1) > 1:
        title += f", tensor-parallel {cfg['tensor_parallel']}"
    if cfg.get("pool_blocks_used") and cfg.get("ceiling_pool_blocks"):
        title += (
            f"; pools of {cfg['pool_blocks_used']:,} blocks "
            f"(ceiling {cfg['ceiling_pool_blocks']:,})"
        )
    if (cfg.get("reuse_rounds") or 1) > 1:
        how = "the order turned by one a round"
        if cfg.get("interleave"):
            how = "servers up, runs alternating"
        title += f"; {cfg['reuse_rounds']} rounds, {how} (medians)"
    if cfg.get("random"):
        title += f"; the no-reuse check, {cfg['random'].get('repeats', 1)} rounds"
    return title


SERVE_SYSTEMS = (
    "vllm", "ceiling", "kvtier", "kvtier-layerwise", "kvtier-whole", "kvtier-disk", "example"
)  # fmt: skip


def ceiling_rows(doc: dict) -> list[str]:
    """Each system's TTFT p50 and mean against vLLM alone and its share of the ceiling's gain
    (a pool that holds everything) on TTFT p50, mean, p99 and the run's duration, where the
    report ran the ceiling (older reports: the p50 share only)."""
    p50_shares = doc.get("ttft_p50_share_of_possible_gain") or {}
    shares = doc.get("share_of_possible_gain") or {"p50": p50_shares}
    metrics = [m for m in ("p50", "mean", "p99", "duration") if m in shares]
    nothing = doc.get("nothing_to_gain") or {}
    runs = {
        (run["system"], run["concurrency"]): run["client"]
        for run in doc.get("runs", [])
        if run.get("dataset") != "random"
    }
    figures = doc.get("figures")
    if figures:  # medians over the rounds (reports before them: one run each)
        runs = {
            key: {
                "ttft_median_ms": figures["p50"][str(key[1])].get(key[0]),
                "ttft_mean_ms": figures["mean"][str(key[1])].get(key[0]),
            }
            for key in runs
            if figures["p50"][str(key[1])].get(key[0]) is not None
        }
    if not any(system == "ceiling" for system, _ in runs):
        return []
    systems = [s for s in SERVE_SYSTEMS if any(k[0] == s for k in runs)]
    gainers = [s for s in systems if s not in ("vllm", "ceiling")]
    out = [
        "",
        "TTFT p50 / mean in ms per system (the median over rounds where there are several); "
        "then each system's share of the ceiling's gain over "
        f"vLLM alone, (alone − system) ÷ (alone − ceiling), on TTFT {', '.join(metrics)} "
        "(`ceiling`: vLLM alone with a pool that holds every token of the run). "
        "\"nothing\": the ceiling's TTFT mean is within noise of vLLM alone's, so there is no "
        "gain to share.",
        "",
        "| concurrency | "
        + " | ".join(f"{s} p50 / mean" for s in systems)
        + "".join(f" | {s}: share ({' · '.join(metrics)})" for s in gainers)
        + " |",
        "| ---: |" + " ---: |" * (len(systems) + len(gainers)),
    ]
    for c in sorted({k[1] for k in runs}):
        cells = []
        for system in systems:
            client = runs.get((system, c))
            if client is None:
                cells.append("—")
                continue
            mean = client.get("ttft_mean_ms")
            cells.append(
                f"{client['ttft_median_ms']:,.0f}" + ("" if mean is None else f" / {mean:,.0f}")
            )
        for system in gainers:
            if nothing.get(str(c)):
                cells.append("nothing")
                continue
            got = [(shares[m].get(str(c)) or {}).get(system) for m in metrics]
            cells.append(" · ".join("—" if g is None else f"{100 * g:.0f} %" for g in got))
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    caveats = doc.get("config", {}).get("ceiling_caveats") or []
    out += ["", *(f"Caveat: {c}." for c in caveats)] if caveats else []
    return out


def render_serve(reports: list[Report]) -> list[str]:
    """The page of ``serve``."""
    out = [
        "# Serving: `kvtier bench serve` and the connector's checks",
        "",
        "Each section: one report, its targets as the report judged them.",
        "",
    ]
    for r in reports:
        name = f"`{os.path.basename(r.path)}`"
        if r.kind == "serve":
            out += [f"## {serve_title(r.doc)}", "", f"{name}; CPU: {r.cpu or 'not recorded'}.", ""]
            out += [
                "| target | measured | required | verdict | detail |",
                "| --- | ---: | --- | --- | --- |",
            ]
            for t in r.doc.get("targets", []):
                out.append(
                    f"| {t['name']} | {t['measured']:.3g} | {t['required']} | **{t['verdict']}** | "
                    f"{t.get('detail', '')} |"
                )
            out += ceiling_rows(r.doc)
        elif r.kind == "overhead":
            doc = r.doc
            out += [
                "## The connector's cost on random prompts (no reuse)",
                "",
                f"{name}; CPU: {r.cpu or 'not recorded'}. {doc.get('prompts', '?')} prompts of "
                f"{doc.get('input_tokens', '?')} tokens a round, servers taking turns; throughput "
                "over vLLM alone's, paired round by round (median).",
                "",
                "| server | rounds | median tokens/s | ÷ vLLM alone, paired | engine core CPU s |",
                "| --- | ---: | ---: | ---: | ---: |",
            ]
            for system, s in doc["systems"].items():
                out.append(
                    f"| {system} | {s['rounds']} | {s['median_tok_s']:.0f} | "
                    f"{s['paired_ratio_median']:.3f} | {s['engine_core_cpu_s_median']:.2f} |"
                )
        elif r.kind == "prefix-ttft":
            doc = r.doc
            ours, theirs = doc["ttft_kvtier_tier_s"], doc["ttft_vllm_prefix_cache_s"]
            out += [
                f"## One prefix of {doc['prefix_tokens']:,} tokens: kvtier's {doc['kvtier_tier']} "
                "tier against vLLM's own prefix cache",
                "",
                f"{name}; CPU: {r.cpu or 'not recorded'}. TTFT of one request whose prefix is "
                f"cached, {len(ours)} rounds: vLLM's cache {min(theirs):.2f}–{max(theirs):.2f} s, "
                f"kvtier's {doc['kvtier_tier']} tier {min(ours):.2f}–{max(ours):.2f} s; median "
                f"ratio **{doc['ratio_median']:.2f}**.",
            ]
        out.append("")
    return out


def storage_of(cfg: dict) -> str:
    """A simulated replica's tiers below its engine, in a few words."""
    kv = cfg.get("kvtier")
    if not kv:
        return "the engines alone (no kvtier)"
    tiers = []
    for t in kv["tiers"]:
        size = t.get("capacity_bytes")
        where = "shared by the fleet" if t.get("shared") else "per replica"
        held = f"{size / 1e9:,.0f} GB" if size else "unlimited"
        tiers.append(f"{t['name']} {held} {where} ({t['read_bandwidth'] / 1e9:g} GB/s reads)")
    return "kvtier's " + ", ".join(tiers)


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def render_fleet(reports: list[Report]) -> list[str]:
    """The page of ``fleet``: per report (one storage), every routing against the replicas."""
    out = [
        "# The simulator's fleet: routing and storage against the replicas",
        "",
        "`kvtier simulate` replays a trace through simulated replicas, every combination of the "
        "replicas and the routing policies of one storage set-up per section (see "
        "`kvtier.sim.routing`). Per point: the share of prompt tokens served from cache (every "
        "source, and the engines' own prefix caches), TTFT, the share of requests within the "
        "SLO, and the GPUs' time computing and waiting for KV (the command's `--plot DIR` draws "
        "them against the replicas, one line per routing). Simulated figures, not measured "
        "ones: only the wall time of the simulation itself was measured on the CPU below.",
        "",
    ]
    for r in reports:
        doc = r.doc
        cfg = doc["config"]
        src = cfg.get("source", {})
        name, series = doc["sweep"], doc["series"]
        out += [
            f"## `{r.path.stem}`: {storage_of(cfg)}",
            "",
            f"`{shown(r.path, PAGES)}`: {src.get('requests', '?')} requests of "
            f"`{Path(str(src.get('trace', '?'))).name}` on {src.get('model', '?')}, one "
            f"{src.get('gpu', '?')} per replica; engine pool "
            f"{cfg['engine']['pool_blocks']:,} blocks of {cfg['engine']['block_tokens']} tokens.",
            "",
            f"| {name} | {series} | hits | engine hits | TTFT p50 s | TTFT p95 s | goodput "
            "| computing | waiting for KV | finished |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in doc["rows"]:
            out.append(
                f"| {row[name]} | {row[series]} | {share(row.get('hit_share'))} | "
                f"{share(row['hit_rate'].get('engine', 0.0))} | {seconds(row['ttft_p50_s'])} | "
                f"{seconds(row['ttft_p95_s'])} | {share(row['goodput_share'])} | "
                f"{share(row['compute_share'])} | {share(row['kv_wait_share'])} | "
                f"{row['requests']} |"
            )
        out.append("")
    return out


def render_reload(reports: list[Report]) -> list[str]:
    """The page of ``reload``: held prompts' TTFT against the same engine recomputing."""
    out = [
        "# Reloading after a restart and across prefill/decode engines",
        "",
        "`kvtier bench reload` times one-token completions on real vLLM servers with kvtier: "
        "`restart`, prompts an engine stored on disk, served by a new engine (every "
        "tensor-parallel rank loading its own part), against fresh prompts of the same length it "
        "recomputes; `pd`, prompts a prefill engine (`kv_producer`) stored in a shared tier, "
        "served by a decode engine (`kv_consumer`) given the producer's `kv_transfer_params`, "
        "against fresh prompts the decode engine recomputes. Held and fresh prompts alternate. "
        "`loaded whole`: every held prompt loaded all its whole chunks, no block failed.",
        "",
        "| report | mode | TP | prompts × tokens | held TTFT p50 s | fresh TTFT p50 s "
        "| speed-up | loaded whole | target |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in reports:
        doc, cfg = r.doc, r.doc["config"]
        speedup = doc.get("speedup")
        out.append(
            f"| `{shown(r.path, PAGES)}` | {cfg['mode']} | {cfg['tp']} | "
            f"{cfg['prompts']} × {cfg['prompt_tokens']} | {seconds(doc['held_ttft_p50_s'])} | "
            f"{seconds(doc['fresh_ttft_p50_s'])} | "
            f"{'—' if speedup is None else f'{speedup:.1f}×'} | {doc['all_loaded']} | "
            f"≥ {doc['target']:.0f}×: {'met' if doc.get('passed') else 'missed'} |"
        )
    return [*out, ""]


FILE_IO_FIGURES = ("read_staged", "read_straight", "write_staged", "write_straight")


def render_transfer(reports: list[Report]) -> list[str]:
    """The page of ``transfer``: the transfer engine's round trips, copies and overlap."""
    out = [
        "# The transfer engine",
        "",
        "`kvtier bench transfer` moves whole KV blocks of a torch-built pool in one of vLLM's "
        "layouts through kvtier's transfer engine (the one the connector's worker half uses). "
        "Copies are GB/s of the engine's gather (`to_host`) and scatter (`to_device`, whole "
        "chunks and layer by layer) against a plain copy of the same bytes in the same run (a "
        "pinned `copy_` on CUDA, a memcpy on CPU). Overlap: a stand-in forward (per layer, "
        "matmuls sized to take about as long as that layer's load) alone and beside a full "
        "load; then waiting for each layer of a load against waiting for the whole load.",
        "",
        "| report | device | model, layout | MiB moved | round trips exact | to_host | to_device "
        "| layer by layer | forward slowed | first / last layer usable | per layer / whole |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in reports:
        doc, cfg = r.doc, r.doc["config"]
        c, o = doc["copies"], doc["overlap"]
        exact = all(t["exact"] for t in doc["round_trips"])
        tiers = ", ".join(t["tier"] for t in doc["round_trips"])
        out.append(
            f"| `{shown(r.path, PAGES)}` | {cfg['device']}: {doc['device_name']} | "
            f"{cfg['model']}, {cfg['layout']} | {c['to_host']['bytes'] / 2**20:.0f} | "
            f"{'yes' if exact else 'NO'} ({tiers}) | "
            + " | ".join(
                f"{c[k]['engine_gbps']:.1f} GB/s ({c[k]['share_of_plain']:.2f}×)"
                for k in ("to_host", "to_device", "to_device_layerwise")
            )
            + f" | {o['slowdown'] * 100:.0f} % | {o['first_layer_usable_s'] * 1e3:.1f} / "
            f"{o['last_layer_usable_s'] * 1e3:.1f} ms | {o['total_layerwise_s'] * 1e3:.1f} / "
            f"{o['total_whole_s'] * 1e3:.1f} ms |"
        )
    out += ["", "GPUDirect Storage: " + "; ".join(
        sorted({
            f"kvikio, compat mode {r.doc['gds']['compat_mode']}" if r.doc["gds"].get("available")
            else r.doc["gds"]["reason"]
            for r in reports
        })
    ) + ".", ""]  # fmt: skip
    files = [r for r in reports if r.doc.get("file_io") and "skipped" not in r.doc["file_io"]]
    if files:
        out += [
            "File reads and writes of a `file://` tier's chunks, GB/s: straight between the file "
            "and the KV's memory (the tier's device verbs: kvikio on CUDA; on CPU, POSIX reads "
            "into the tensors, through the page cache) and staged through host memory (the "
            "tier's host path, O_DIRECT where the filesystem takes it, and a copy).",
            "",
            "| report | device | I/O, compat mode | MiB | read staged | read straight "
            "| write staged | write straight | bit-exact |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in files:
            f = r.doc["file_io"]
            out.append(
                f"| `{shown(r.path, PAGES)}` | {r.doc['config']['device']} | {f['library']}, "
                f"{f['compat_mode']} | {f['bytes'] / 2**20:.0f} | "
                + " | ".join(f"{f[f'{k}_gbps']:.2f}" for k in FILE_IO_FIGURES)
                + f" | {'yes' if f['exact'] else 'NO'} |"
            )
        out.append("")
    return out


PEER_CLASSES = ("host memory", "local disk", "redis", "mooncake")
PEER_SIDES = {"kvtier": 0, "peer": 1, "reference": 2}


def peer_stat(system: dict, phase: str, op: str, field: str = "p50") -> float | None:
    """One latency figure of a `kvtier bench peers` system (None where not measured)."""
    stats = system["latency_s"].get(phase, {}).get(op)
    return stats[field] if stats and stats.get("count") else None


def peer_rate(system: dict, depth: int, op: str) -> str:
    """GB/s of ``op`` at ``depth`` in flight, as a cell."""
    row = next((t for t in system["throughput"] if t["depth"] == depth and t["op"] == op), None)
    return "—" if row is None else f"{row['gbps']:.2f}"


def peer_ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.2f}"


def render_peers(reports: list[Report]) -> list[str]:
    """The page of ``peers``: kvtier's tiers beside LMCache's backends and Mooncake Store's own
    client on the same KV, with the raw floor of each medium, and the targets."""
    out = [
        "# kvtier beside LMCache and Mooncake Store",
        "",
        "`kvtier bench peers` stores, looks up and retrieves the same KV chunks through kvtier's "
        "tiers (`memory://`, `slab://`, `redis://`, `mooncake://`: the product's path, chunk keys "
        "from token ids, one `TieredCache`, each chunk copied once out of the engine's KV into a "
        "reused save buffer (for `memory://`, a slot the tier lends, stored where it lies), loads "
        "straight into the destination), LMCache's storage engine run as a "
        "library (local CPU, local disk, Redis; the bench's own CPU connector copies chunk bytes "
        "between the KV buffer and LMCache's memory objects) and Mooncake Store's own Python "
        "client, next to the raw floor of each medium (a memcpy, fio, redis-py, Mooncake's "
        "zero-copy get), in one run: each round visits every system, the order turning by one "
        "each round. A store counts once a fresh lookup finds every chunk; every retrieved chunk "
        "is compared byte for byte with what was stored. Cold reads drop the files' page cache "
        "first (posix_fadvise); warm reads follow them. Each system has its own server (Redis) "
        "or its own key prefix (Mooncake, one store process). Servers run on 127.0.0.1, started "
        "and stopped by the bench.",
        "",
    ]
    for r in reports:
        doc, cfg = r.doc, r.doc["config"]
        geo = cfg["geometry"]
        systems = sorted(
            doc["systems"],
            key=lambda s: (
                PEER_CLASSES.index(s["tier_class"]) if s["tier_class"] in PEER_CLASSES else 9,
                PEER_SIDES.get(s["side"], 9),
                s["name"],
            ),
        )
        depths = cfg["depths"]
        verdict = {True: "met", False: "missed", None: "—"}
        out += [
            f"## `{shown(r.path, PAGES)}`",
            "",
            f"{geo['model']} KV ({geo['layers']} layers, {geo['kv_heads']} KV heads, head dim "
            f"{geo['head_dim']}, {geo['dtype']}: {geo['bytes_per_token']:,} B a token, "
            f"{geo['chunk_bytes']:,} B a {geo['chunk_tokens']}-token chunk). One chunk: "
            f"{cfg['payload']} KV, {cfg['chunk_rounds']} rounds. Long prefix: "
            f"{cfg['prefix_tokens']:,} tokens of synthetic {geo['dtype']} KV in the same "
            f"geometry, {cfg['prefix_rounds']} rounds. Throughput: {cfg['requests']} one-chunk "
            f"requests at {', '.join(map(str, depths))} in flight. Versions: "
            + (", ".join(f"{k} {v}" for k, v in doc.get("versions", {}).items()) or "—")
            + ".",
            "",
            "### Targets",
            "",
            "| tier class | what | kvtier | peer | kvtier's | peer's | ratio | target | verdict |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | --- | --- |",
        ]
        for t in doc["targets"]:
            digits = 3 if "p50" in t["what"] else 2
            out.append(
                f"| {t['tier_class']} | {t['what']} | {t['kvtier']} | {t['peer']} | "
                f"{t['kvtier_value']:.{digits}f} | {t['peer_value']:.{digits}f} | "
                f"{t['ratio']:.2f}× | {t['bound'] or '—'} | {verdict[t['met']]} |"
            )
        png = r.path.with_suffix(".png")
        if png.exists():  # the report's --plot, kept beside it
            out += ["", f"![{png.stem}]({shown(png, PAGES)})"]
        out += [
            "",
            "### Latency",
            "",
            f"One chunk in ms; the {cfg['prefix_tokens']:,}-token prefix in s (its lookup in "
            "ms). Retrieve: cold; warm: again, from the page cache (systems that read through "
            "it).",
            "",
            "| tier class | system | chunk store p50 | p95 | chunk retrieve p50 | p95 | warm p50 "
            "| prefix store p50 | p95 | lookup p50 | prefix retrieve p50 | p95 | warm p50 "
            "| exact |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: | --- |",
        ]
        for s in systems:
            if s["error"]:
                out.append(f"| {s['tier_class']} | {s['name']} | failed: {s['error']} |")
                continue
            exact = {True: "yes", False: "NO", None: "—"}[s["exact"]]
            out.append(
                f"| {s['tier_class']} | {s['name']} | "
                f"{peer_ms(peer_stat(s, 'chunk', 'store'))} | "
                f"{peer_ms(peer_stat(s, 'chunk', 'store', 'p95'))} | "
                f"{peer_ms(peer_stat(s, 'chunk', 'retrieve'))} | "
                f"{peer_ms(peer_stat(s, 'chunk', 'retrieve', 'p95'))} | "
                f"{peer_ms(peer_stat(s, 'chunk', 'retrieve_warm'))} | "
                f"{seconds(peer_stat(s, 'prefix', 'store'))} | "
                f"{seconds(peer_stat(s, 'prefix', 'store', 'p95'))} | "
                f"{peer_ms(peer_stat(s, 'prefix', 'lookup'))} | "
                f"{seconds(peer_stat(s, 'prefix', 'retrieve'))} | "
                f"{seconds(peer_stat(s, 'prefix', 'retrieve', 'p95'))} | "
                f"{seconds(peer_stat(s, 'prefix', 'retrieve_warm'))} | {exact} |"
            )
        out += [
            "",
            "### Throughput and bytes per token",
            "",
            "GB/s (decimal) of one-chunk requests: stores until a lookup finds them all, then "
            "cold retrieves. Bytes per token: what the system holds for the one-chunk rounds' "
            "KV (headers, metadata and values' own bytes included), and kvtier's with each codec.",
            "",
            "| tier class | system | "
            + " | ".join(f"store ×{d}" for d in depths)
            + " | "
            + " | ".join(f"retrieve ×{d}" for d in depths)
            + " | B/token | raw | kv |",
            "| --- | --- | " + " | ".join("---:" for _ in range(2 * len(depths) + 3)) + " |",
        ]
        for s in systems:
            if s["error"]:
                continue
            codecs = s.get("codec_bytes_per_token") or {}
            held = [s["bytes_per_token"], codecs.get("raw"), codecs.get("kv")]
            cells = [
                *(peer_rate(s, d, "store") for d in depths),
                *(peer_rate(s, d, "retrieve") for d in depths),
                *("—" if v is None else f"{v:,.0f}" for v in held),
            ]
            out.append(f"| {s['tier_class']} | {s['name']} | " + " | ".join(cells) + " |")
        out += ["", "### Systems", ""]
        out += [f"- {s['name']}: {s['detail']}." for s in systems]
        for name, why in doc.get("unavailable", {}).items():
            out.append(f"- not available: {name}: {why}")
        for note in doc.get("notes", []):
            out.append(f"- {note}")
        out.append("")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    pages = {
        "storage": ("tabulate storage runs of one version", {"storage"}, render_storage),
        "codec": (
            "coded tiers, the codec bench, --disk-codec runs",
            {"storage", "codec", "run"},
            render_codec,
        ),
        "run": ("kvtier run reports", {"run"}, render_run),
        "serve": (
            "kvtier bench serve and the connector's checks",
            {"serve", "overhead", "prefix-ttft"},
            render_serve,
        ),
        "fleet": ("kvtier simulate's routing × replicas sweeps", {"fleet"}, render_fleet),
        "reload": ("kvtier bench reload: restart and prefill/decode", {"reload"}, render_reload),
        "peers": ("kvtier bench peers: beside LMCache and Mooncake Store", {"peers"}, render_peers),
        "transfer": ("kvtier bench transfer: the transfer engine", {"transfer"}, render_transfer),
    }
    for name, (text, _, _) in pages.items():
        one = sub.add_parser(name, help=text)
        one.add_argument("reports", nargs="+")
        one.add_argument("--out", required=True)
    two = sub.add_parser("ab", help="compare runs before and after a change")
    two.add_argument("--before", nargs="+", required=True)
    two.add_argument("--after", nargs="+", required=True)
    two.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.what == "ab":
        before, after = load(args.before, {"storage"}), load(args.after, {"storage"})
        lines = render_ab(before, after) + provenance(before + after, out.parent)
    else:
        _, kinds, render = pages[args.what]
        reports = load(args.reports, kinds)
        lines = render(reports) + provenance(reports, out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip("\n") + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
