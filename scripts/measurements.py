#!/usr/bin/env python3
"""Render ``kvtier bench storage --json`` outputs into Markdown under ``docs/benchmarks/``.

    scripts/measurements.py storage RUN.json [RUN.json …] --out docs/benchmarks/storage.md
    scripts/measurements.py ab --before B.json … --after A.json … --out docs/benchmarks/x.md
    scripts/measurements.py codec RUN.json [RUN.json …] --out docs/benchmarks/codec-tiers.md

``storage`` tabulates kvtier ÷ reference per block size, tier, operation and depth: the median
over the runs given and their range, with the target and the verdict of the median. ``ab``
compares two versions of the code measured in the same session (runs alternating): per cell the
median and range of each, and whether the new median is at least 0.95 × the old one or inside
the old range, and whether a target the old code met is still met. ``codec`` pairs the tiers of
one run whose URLs differ only in ``codec=`` and tabulates coded ÷ raw (GB/s of raw bytes) per
payload, tier, operation and depth. Figures come only from the JSON; the machine (CPU,
filesystem, fio) is taken from the runs' ``environment``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

Cell = tuple[int, str, str, int]  # block bytes, tier scheme, op, depth


def load(paths: list[str]) -> list[dict]:
    """The reports in ``paths`` (one ``--json`` document each)."""
    docs = []
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            sys.exit(f"measurements: cannot read {path}: {exc}")
        if doc.get("benchmark") != "storage":
            sys.exit(f"measurements: {path} is not a `kvtier bench storage --json` report")
        docs.append(doc)
    return docs


def cells(docs: list[dict], field: str = "ratio") -> tuple[dict[Cell, list[float]], dict]:
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


def span(values: list[float]) -> str:
    """``median (min–max)`` of a cell's ratios."""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(values):.2f}–{max(values):.2f})"


def machine(docs: list[dict]) -> str:
    """One line naming the machine the runs were measured on."""
    env = docs[0].get("environment", {})
    cpu = env.get("cpu") or "CPU not recorded"
    fs = env.get("filesystem")
    disk = f"; disk tiers on {fs}" if fs else ""
    return f"{env.get('cpus', '?')} × {cpu}{disk}; fio {env.get('fio') or 'none'}"


def render_storage(docs: list[dict]) -> str:
    """The Markdown of ``storage``."""
    ratios, targets = cells(docs)
    out = [
        "# Storage: kvtier ÷ reference",
        "",
        f"From {len(docs)} `kvtier bench storage --json` reports; machine: {machine(docs)}.",
        "Each cell: median kvtier ÷ reference over the runs (their range); the reference is fio",
        "with the tier's engine and layout for disk tiers, a plain copy for memory, the raw",
        "client for shared tiers (redis-py as it comes, obstore). Target and verdict of the",
        "median where a target applies (blocks ≥ 256 KiB).",
        "",
    ]
    for block in sorted({c[0] for c in ratios}):
        out += [f"## {size_text(block)} blocks", "", "| tier | op | depth | ratio | target |"]
        out.append("| --- | --- | --- | --- | --- |")
        for cell in sorted(c for c in ratios if c[0] == block):
            _, scheme, op, depth = cell
            target = targets.get(cell)
            med = statistics.median(ratios[cell])
            verdict = "" if target is None else f"{target} {'PASS' if med >= target else 'MISS'}"
            out.append(f"| {scheme}:// | {op} | {depth} | {span(ratios[cell])} | {verdict} |")
        out.append("")
    return "\n".join(out)


def render_ab(before: list[dict], after: list[dict]) -> str:
    """The Markdown of ``ab``."""
    old, targets = cells(before)
    new, _ = cells(after)
    out = [
        "# Storage A/B: the code before and after, in one session",
        "",
        f"{len(before)} reports before, {len(after)} after, alternating; machine: "
        f"{machine(after)}.",
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
        code: (cells(docs, "gbps")[0], cells(docs, "ref")[0])
        for code, docs in (("before", before), ("after", after))
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
    out += ["", f"Cells that do not hold: {failed}."]
    return "\n".join(out)


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


def render_codec(docs: list[dict]) -> str:
    """The Markdown of ``codec``."""
    plain, fair = codec_pairs(docs)
    out = [
        "# Coded tiers: `codec=kv` ÷ `codec=raw`",
        "",
        f"From {len(docs)} `kvtier bench storage --json` reports; machine: {machine(docs)}.",
        "Each cell: raw bytes delivered per second by a tier with `codec=kv` over the same tier",
        "with `codec=raw`, measured in the same run on the same blocks; median over the runs",
        "(their range). `random`: random bytes in the KV layout (the codec must cost nothing);",
        "`kv`: real KV chunks of the embedded model (what the codec buys). The last column: each",
        "tier's rate first divided by its own reference, run in turns with that tier's passes",
        "(fio's reads and writes of raw blocks for a disk tier, where the run had fio; a memory",
        "copy for `memory://`), so the machine's drift between the two tiers' turns cancels.",
        "",
        "| payload | tier | op | depth | kv ÷ raw | kv ÷ raw, each over its reference |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cell in sorted(plain):
        payload, scheme, op, depth = cell
        over = span(fair[cell]) if fair.get(cell) else "—"
        out.append(f"| {payload} | {scheme}:// | {op} | {depth} | {span(plain[cell])} | {over} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("storage", help="tabulate runs of one version")
    one.add_argument("runs", nargs="+")
    one.add_argument("--out", required=True)
    two = sub.add_parser("ab", help="compare runs before and after a change")
    two.add_argument("--before", nargs="+", required=True)
    two.add_argument("--after", nargs="+", required=True)
    two.add_argument("--out", required=True)
    coded = sub.add_parser("codec", help="coded ÷ raw tiers of the same runs")
    coded.add_argument("runs", nargs="+")
    coded.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.what == "storage":
        text = render_storage(load(args.runs))
    elif args.what == "codec":
        text = render_codec(load(args.runs))
    else:
        text = render_ab(load(args.before), load(args.after))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
