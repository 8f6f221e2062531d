"""``kvtier bench peers``' report: the targets (kvtier against each peer, same tier class, same
run), the tables, the JSON document and the plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvtier.bench.peers import PeersReport, SystemResult
from kvtier.bench.peers_systems import HOST_MEMORY, LOCAL_DISK, MOONCAKE, REDIS, TIER_CLASSES

SCHEMA = "kvtier.bench.peers/1"
#: kvtier's system and the peer it is held against, per tier class.
PAIRS = {
    HOST_MEMORY: ("kvtier memory://", "LMCache local_cpu"),
    LOCAL_DISK: ("kvtier slab://", "LMCache local_disk"),
    REDIS: ("kvtier redis://", "LMCache redis"),
}
MOONCAKE_PAIR = ("kvtier mooncake://", "Mooncake client")
RETRIEVE_MAX = 1.0  # kvtier's prefix retrieve p50 ÷ the peer's
STORE_MIN = 1.0  # kvtier's store throughput ÷ the peer's
CAPACITY_MIN = 1.4  # the peer's bytes per token ÷ kvtier's, with its codec
MOONCAKE_MIN = 0.8  # mooncake:// retrieve throughput ÷ Mooncake's own client's


@dataclass(frozen=True)
class Target:
    """One cell of the targets: kvtier's figure, the peer's, their ratio and the bound."""

    tier_class: str
    what: str
    kvtier: str
    peer: str
    kvtier_value: float
    peer_value: float
    ratio: float
    bound: str  # "≤ 1.0×" / "≥ 1.4×"; "" where no target applies
    met: bool | None

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return asdict(self)


def _p50(result: SystemResult, phase: str, op: str) -> float | None:
    stats = result.latency.get(phase, {}).get(op)
    return stats.p50 if stats is not None and stats.count else None


def _usable(report: PeersReport, name: str) -> SystemResult | None:
    result = report.result(name)
    return result if result is not None and result.error is None else None


def targets(report: PeersReport) -> list[Target]:
    """Every target cell the run can fill: per tier class where both sides ran."""
    out: list[Target] = []
    for tier_class, (mine_name, peer_name) in PAIRS.items():
        mine, peer = _usable(report, mine_name), _usable(report, peer_name)
        if mine is None or peer is None:
            continue
        prefix = f"{report.config.prefix_tokens:,}-token prefix"
        reads = [("retrieve", "retrieve", f"{prefix} retrieve p50 (cold)")]
        if tier_class == LOCAL_DISK:  # slab:// reads with O_DIRECT: its cold read is its read
            warm = "retrieve_warm" if "retrieve_warm" in mine.latency.get("prefix", {}) else None
            reads.append((warm or "retrieve", "retrieve_warm", f"{prefix} retrieve p50 (warm)"))
        for my_op, peer_op, what in reads:
            a, b = _p50(mine, "prefix", my_op), _p50(peer, "prefix", peer_op)
            if a and b:
                out.append(
                    Target(
                        tier_class, what, mine_name, peer_name, a, b, a / b,
                        f"≤ {RETRIEVE_MAX:.1f}×", a / b <= RETRIEVE_MAX,
                    )
                )  # fmt: skip
        out += _rate_targets(report, tier_class, "store", (mine_name, mine), (peer_name, peer))
        coded = mine.codec_bytes_per_token.get("kv")
        if coded and peer.bytes_per_token:
            ratio = peer.bytes_per_token / coded
            applies = tier_class != HOST_MEMORY  # memory:// stores raw unless told codec=kv
            out.append(
                Target(
                    tier_class, "bytes per token, peer ÷ kvtier (codec=kv)", mine_name, peer_name,
                    coded, peer.bytes_per_token, ratio,
                    f"≥ {CAPACITY_MIN:.1f}×" if applies else "",
                    ratio >= CAPACITY_MIN if applies else None,
                )
            )  # fmt: skip
    mine, peer = _usable(report, MOONCAKE_PAIR[0]), _usable(report, MOONCAKE_PAIR[1])
    if mine is not None and peer is not None:
        pair = ((MOONCAKE_PAIR[0], mine), (MOONCAKE_PAIR[1], peer))
        out += _rate_targets(report, MOONCAKE, "retrieve", *pair, least=MOONCAKE_MIN)
    return out


def _rate_targets(
    report: PeersReport, tier_class: str, op: str, mine: tuple, peer: tuple, least=STORE_MIN
) -> list[Target]:
    """kvtier's ``op`` GB/s against its peer's at each depth, held to at least ``least``×."""
    (mine_name, a), (peer_name, b) = mine, peer
    out = []
    for depth in report.config.depths:
        ra, rb = a.rate(depth, op), b.rate(depth, op)
        if ra and rb and rb["gbps"] > 0:
            ratio = ra["gbps"] / rb["gbps"]
            out.append(
                Target(
                    tier_class, f"{op} GB/s at {depth} in flight", mine_name, peer_name,
                    ra["gbps"], rb["gbps"], ratio, f"≥ {least:.1f}×", ratio >= least,
                )
            )  # fmt: skip
    return out


def passed(report: PeersReport) -> bool | None:
    """Whether every target that applies was met (None when none could be measured)."""
    verdicts = [t.met for t in targets(report) if t.met is not None]
    return all(verdicts) if verdicts else None


def peers_dict(report: PeersReport) -> dict:
    """The report as a JSON-ready dict (without the schema, date, command and machine, which
    the command adds)."""
    cells = targets(report)
    return {
        "config": report.config.as_dict(),
        "versions": report.versions,
        "systems": [r.as_dict() for r in report.results],
        "targets": [t.as_dict() for t in cells],
        "passed": passed(report),
        "unavailable": report.unavailable,
        "notes": report.notes,
    }


# --- the tables --------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f}"


def _s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.3f}"


def _stat(result: SystemResult, phase: str, op: str, field: str) -> float | None:
    stats = result.latency.get(phase, {}).get(op)
    return getattr(stats, field) if stats is not None and stats.count else None


def _ordered(report: PeersReport) -> list[SystemResult]:
    rank = {c: i for i, c in enumerate(TIER_CLASSES)}
    sides = {"kvtier": 0, "peer": 1, "reference": 2}
    return sorted(
        report.results, key=lambda r: (rank.get(r.tier_class, 9), sides.get(r.side, 9), r.name)
    )


def latency_table(report: PeersReport) -> Table:
    """Store, lookup and retrieve latency per system: one chunk (ms) and the long prefix (s)."""
    cfg = report.config
    table = Table(
        title=f"latency — one {cfg.chunk_tokens}-token chunk ({cfg.payload} KV, ms) and a "
        f"{cfg.prefix_tokens}-token prefix (synthetic {cfg.geometry.dtype} KV, s); "
        "retrieve: cold, warm: from the page cache"
    )
    for col in ("tier", "system"):
        table.add_column(col)
    for col in (
        "chunk store p50",
        "p95",
        "chunk retrieve p50",
        "p95",
        "warm p50",
        "prefix store p50",
        "p95",
        "lookup p50 ms",
        "prefix retrieve p50",
        "p95",
        "warm p50",
    ):
        table.add_column(col, justify="right")
    table.add_column("exact")
    for r in _ordered(report):
        if r.error is not None:
            table.add_row(r.tier_class, r.name, Text("failed", "red"))
            continue
        exact = "—" if r.chunks_checked == 0 else ("yes" if r.wrong_chunks == 0 else "NO")
        table.add_row(
            r.tier_class,
            r.name,
            _ms(_stat(r, "chunk", "store", "p50")),
            _ms(_stat(r, "chunk", "store", "p95")),
            _ms(_stat(r, "chunk", "retrieve", "p50")),
            _ms(_stat(r, "chunk", "retrieve", "p95")),
            _ms(_stat(r, "chunk", "retrieve_warm", "p50")),
            _s(_stat(r, "prefix", "store", "p50")),
            _s(_stat(r, "prefix", "store", "p95")),
            _ms(_stat(r, "prefix", "lookup", "p50")),
            _s(_stat(r, "prefix", "retrieve", "p50")),
            _s(_stat(r, "prefix", "retrieve", "p95")),
            _s(_stat(r, "prefix", "retrieve_warm", "p50")),
            Text(exact, "green" if exact == "yes" else "red" if exact == "NO" else ""),
        )
    return table


def throughput_table(report: PeersReport) -> Table:
    """GB/s of one-chunk requests at each depth (store until seen, retrieve cold), and bytes
    held per token."""
    depths = report.config.depths
    table = Table(
        title=f"throughput — {report.config.requests} one-chunk requests, GB/s at "
        f"{'/'.join(map(str, depths))} in flight; bytes held per token"
    )
    for col in ("tier", "system"):
        table.add_column(col)
    for op in ("store", "retrieve"):
        for d in depths:
            table.add_column(f"{op} ×{d}", justify="right")
    table.add_column("B/token", justify="right")
    table.add_column("B/token raw|kv", justify="right")
    for r in _ordered(report):
        if r.error is not None:
            continue
        cells = []
        for op in ("store", "retrieve"):
            for d in depths:
                row = r.rate(d, op)
                cells.append("—" if row is None else f"{row['gbps']:.2f}")
        codecs = r.codec_bytes_per_token
        both = (
            f"{codecs['raw']:.0f} | {codecs['kv']:.0f}" if {"raw", "kv"} <= codecs.keys() else "—"
        )
        held = "—" if r.bytes_per_token is None else f"{r.bytes_per_token:.0f}"
        table.add_row(r.tier_class, r.name, *cells, held, both)
    return table


def targets_table(report: PeersReport) -> Table:
    """The targets, cell by cell."""
    table = Table(title="targets — kvtier ÷ the peer, same tier class, same run")
    for col in ("tier", "what", "kvtier", "peer", "ratio", "target", "verdict"):
        table.add_column(col, justify="right" if col in ("kvtier", "peer", "ratio") else "left")
    for t in targets(report):
        unit = (lambda v: f"{v:.3f}") if "p50" in t.what else (lambda v: f"{v:.2f}")
        verdict = "—" if t.met is None else ("met" if t.met else "missed")
        table.add_row(
            t.tier_class,
            t.what,
            unit(t.kvtier_value),
            unit(t.peer_value),
            f"{t.ratio:.2f}×",
            t.bound or "—",
            Text(verdict, "green" if t.met else "red" if t.met is False else ""),
        )
    return table


def render(report: PeersReport, out) -> None:
    """Print the tables, what could not run, and the notes."""
    out.print(
        Group(
            latency_table(report),
            throughput_table(report),
            targets_table(report),
        )
    )
    for r in _ordered(report):
        if r.error is not None:
            out.print(f"failed: {r.name}: {r.error}", highlight=False)
    for name, why in report.unavailable.items():
        out.print(f"not available: {name}: {why}", highlight=False)
    for note in report.notes:
        out.print(f"note: {note}", highlight=False)


def peers_json(document: dict) -> str:
    """The JSON text of a report document."""
    return json.dumps(document, indent=2)


# --- the plot ----------------------------------------------------------------------------------
def peers_plot(report: PeersReport, path: str | Path) -> Path:
    """Prefix retrieve and store p50 per system, retrieve throughput against depth, and bytes
    per token, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in _ordered(report) if r.error is None]
    names = [r.name for r in rows]
    prefix = report.config.prefix_tokens
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    colors = {"kvtier": "tab:blue", "peer": "tab:orange", "reference": "tab:gray"}
    for ax, op, title in (
        (axes[0][0], "retrieve", f"{prefix}-token prefix: retrieve p50 (s, cold)"),
        (axes[0][1], "store", f"{prefix}-token prefix: store p50 (s, until a lookup sees it)"),
    ):
        values = [_stat(r, "prefix", op, "p50") or 0.0 for r in rows]
        ax.barh(names, values, color=[colors.get(r.side, "k") for r in rows])
        ax.set_title(title, fontsize=9)
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
    ax = axes[1][0]
    ax.set_prop_cycle(color=[plt.get_cmap("tab20")(i % 20) for i in range(len(rows))])
    depths = list(report.config.depths)
    for r in rows:
        rates = [r.rate(d, "retrieve") for d in depths]
        if all(rates):
            style = "-" if r.side == "kvtier" else "--" if r.side == "peer" else ":"
            ax.plot(depths, [x["gbps"] for x in rates if x], style, marker="o", label=r.name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_title("one-chunk retrieve GB/s by requests in flight (cold)", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[1][1]
    held = [(r.name, r.bytes_per_token, r.side) for r in rows if r.bytes_per_token]
    ax.barh([h[0] for h in held], [h[1] for h in held], color=[colors.get(h[2], "k") for h in held])
    ax.set_title("bytes held per token (real KV where the run used it)", fontsize=9)
    ax.invert_yaxis()
    ax.tick_params(labelsize=7)
    geo = report.config.geometry
    title = f"kvtier bench peers — {geo.model}, {geo.dtype}, {geo.chunk_tokens}-token chunks"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


__all__ = [
    "CAPACITY_MIN",
    "MOONCAKE_MIN",
    "PAIRS",
    "RETRIEVE_MAX",
    "SCHEMA",
    "STORE_MIN",
    "Target",
    "passed",
    "peers_dict",
    "peers_json",
    "peers_plot",
    "render",
    "targets",
]
