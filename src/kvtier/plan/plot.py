"""A three-panel PNG of a plan: where KV lives, reload vs recompute per tier, GPU waiting.

matplotlib is imported here only, so ``kvtier plan`` without ``--plot`` never loads it.
"""

from __future__ import annotations

import math
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.plan.planner import Plan, PlanRequest, reload_curves

_COLOURS = {
    "hbm": "#4c72b0",
    "dram": "#55a868",
    "nvme": "#dd8452",
    "shared": "#8172b3",
    "dropped": "#c44e52",
}


def _tokens(value: float) -> str:
    n = round(value)
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _curve_lengths(context: int, breaks: list[int]) -> list[int]:
    hi = max([context, *breaks]) * 2
    n, out = 16, []
    while n <= hi:
        out.append(int(n))
        n *= 2**0.25
    return sorted({*out, *breaks, context})


def write_plot(result: Plan, req: PlanRequest, path: str | Path) -> Path:
    """Write the plan's PNG to ``path``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ConfigError(f"--plot writes a PNG; give a file name ending in .png, not {path.name}")
    if not path.parent.exists():
        raise ConfigError(f"--plot: folder {path.parent} does not exist")

    i, cap = result.inputs, result.capacity
    roles = [t["role"] for t in i["tiers"]]
    fig, (ax_mem, ax_cost, ax_wait) = plt.subplots(1, 3, figsize=(19, 6.2), layout="constrained")
    fig.suptitle(
        f"{i['model']} on {i['gpus']}× {i['gpu']} — {i['context']:,}-token context, "
        f"{i['prefix_reuse']:.0%} prefix reuse  (KV {i['kv_dtype']}, weights {i['weight_dtype']})",
        fontsize=14,
    )

    # 1. Where the KV of all sessions lives, per concurrency.
    rows = result.rows
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    layers = [("hbm", "in HBM", [r.hbm_kv_bytes / 1e9 for r in rows])]
    layers += [(role, f"→ {role}", [r.spill_bytes[role] / 1e9 for r in rows]) for role in roles]
    layers.append(("dropped", "dropped (recomputed)", [r.unplaced_bytes / 1e9 for r in rows]))
    for key, label, values in layers:
        if any(values):
            ax_mem.bar(x, values, bottom=bottom, label=label, color=_COLOURS.get(key), width=0.75)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax_mem.set_xticks(list(x), [str(r.concurrency) for r in rows])
    ax_mem.set_xlabel("concurrent requests (sessions)")
    ax_mem.set_ylabel("KV bytes, all GPUs (GB)")
    ax_mem.set_title("Where the KV lives")
    top = max(bottom) * 1.08
    level = cap.kv_pool_bytes_total / 1e9
    ax_mem.axhline(level, color="black", ls="--", lw=1.2)
    ax_mem.text(-0.4, level, f" HBM KV pool {level:,.0f} GB", va="bottom", fontsize=9)
    for t in result.tiers:
        if t.capacity_bytes is None:
            continue
        level += t.capacity_bytes * t.codec_ratio / 1e9
        if level < top:
            ax_mem.axhline(level, color=_COLOURS.get(t.role, "grey"), ls=":", lw=1.2)
            ax_mem.text(-0.4, level, f" + {t.role} full {level:,.0f} GB", va="bottom", fontsize=9)
    for k, r in enumerate(rows):
        if r.concurrency == cap.overflow_concurrency:
            ax_mem.annotate(
                "HBM overflows",
                (k, r.kv_demand_bytes / 1e9),
                xytext=(0, 40),
                textcoords="offset points",
                ha="center",
                fontsize=9,
                color="#c44e52",
                arrowprops={"arrowstyle": "->", "color": "#c44e52"},
            )
    ax_mem.set_ylim(0, top)
    ax_mem.legend(loc="upper left", fontsize=9)
    ax_mem.grid(axis="y", alpha=0.3)

    # 2. Reload vs recompute seconds against prefix length, with break-even markers.
    breaks = [t.break_even_tokens for t in result.tiers if t.break_even_tokens]
    lengths = _curve_lengths(i["context"], breaks)
    curves = reload_curves(req, lengths)
    if curves:
        first = next(iter(curves.values()))
        ax_cost.plot(
            lengths,
            [c.recompute_s for c in first],
            color="black",
            lw=2.2,
            label="recompute (prefill)",
        )
        for t in result.tiers:
            curve = curves[t.role]
            colour = _COLOURS.get(t.role, "grey")
            ax_cost.plot(
                lengths,
                [c.reload_s for c in curve],
                color=colour,
                lw=1.8,
                label=f"reload from {t.role} ({t.medium})",
            )
            be = t.break_even_tokens
            if be:
                y = next(c.reload_s for c in curve if c.tokens == be)
                ax_cost.plot([be], [y], "o", color=colour, ms=8, mec="black")
                ax_cost.annotate(
                    f"{be:,}",
                    (be, y),
                    xytext=(6, -14),
                    textcoords="offset points",
                    fontsize=9,
                    color=colour,
                )
        ax_cost.axvline(i["prefix_tokens"], color="grey", ls="--", lw=1)
        ax_cost.text(
            i["prefix_tokens"],
            0.02,
            "planned prefix ",
            rotation=90,
            va="bottom",
            ha="right",
            fontsize=8,
            color="grey",
            transform=ax_cost.get_xaxis_transform(),
        )
        ax_cost.set_xscale("log", base=2)
        ax_cost.set_yscale("log")
        ticks = [4**k for k in range(1, 12) if 4**k <= lengths[-1]]
        ax_cost.xaxis.set_major_locator(FixedLocator(ticks))
        ax_cost.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tokens(v)))
        ax_cost.xaxis.set_minor_formatter(NullFormatter())
        ax_cost.legend(loc="upper left", fontsize=9)
    else:
        ax_cost.text(0.5, 0.5, "no tiers configured", ha="center", transform=ax_cost.transAxes)
    ax_cost.set_xlabel("cached prefix length (tokens)")
    ax_cost.set_ylabel("seconds per GPU")
    ax_cost.set_title("Reload vs recompute (● break-even)")
    ax_cost.grid(alpha=0.3, which="both")

    # 3. What the spill costs: GPU time waiting for KV, host link load, NVMe wear.
    conc = [r.concurrency for r in rows]
    for percent, style, colour, label in (
        ([100 * r.gpu_wait_fraction for r in rows], "o-", "#c44e52", "GPU time waiting for KV"),
        ([100 * r.link_utilization for r in rows], "s-", "#4c72b0", "host link busy"),
    ):
        ax_wait.plot(conc, percent, style, color=colour, label=label)
    ax_wait.axvline(cap.overflow_concurrency, color="black", ls="--", lw=1)
    ax_wait.text(
        cap.overflow_concurrency, 1, " HBM overflows", rotation=90, va="bottom", fontsize=8
    )
    ax_wait.set_xscale("log", base=2)
    ax_wait.xaxis.set_major_locator(FixedLocator(conc))
    ax_wait.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_wait.xaxis.set_minor_formatter(NullFormatter())
    ax_wait.set_xlabel("concurrent requests (sessions)")
    ax_wait.set_ylabel("% of time")
    ax_wait.set_ylim(0, max(100.0, *(100 * r.link_utilization for r in rows)) * 1.05)
    ax_wait.set_title("Cost of the spill")
    ax_wait.grid(alpha=0.3)
    handles, labels = ax_wait.get_legend_handles_labels()
    dwpd = [r.nvme_drive_writes_per_day for r in rows]
    if any(d is not None for d in dwpd):
        ax_dw = ax_wait.twinx()
        ax_dw.plot(
            conc,
            [d or 0 for d in dwpd],
            "^-",
            color=_COLOURS["nvme"],
            label="NVMe drive writes/day",
        )
        nvme = next((t for t in result.tiers if t.role == "nvme"), None)
        rating = nvme.rated_dwpd if nvme else None
        if rating:
            ax_dw.axhline(rating, color=_COLOURS["nvme"], ls=":", lw=1.2)
            ax_dw.text(
                conc[0],
                rating,
                f" rated {rating:g} DWPD",
                va="bottom",
                fontsize=8,
                color=_COLOURS["nvme"],
            )
        top = max([d or 0 for d in dwpd] + [rating or 0])
        ax_dw.set_ylim(0, (top if math.isfinite(top) and top > 0 else 1) * 1.15)
        ax_dw.set_ylabel("NVMe drive writes per day")
        h2, l2 = ax_dw.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax_wait.legend(handles, labels, loc="upper left", fontsize=9)

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
