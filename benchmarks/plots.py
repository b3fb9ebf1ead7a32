"""Matplotlib figures: the replay timeline (the paper's Figure 6 shape) and the handoff grid.

``replay_plots`` draws, for the first run of every system, (top) live obsolete executions over
time and (bottom) cumulative tokens read per version over time, obsolete reads marked with red
crosses; ``handoff_plot`` draws reused prefix tokens and successor TTFT (engine steps) against
eviction pressure,
native vs Retire, one column per (prompt length, common-prefix fraction). Small PNGs (Agg backend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retire_bench import metrics as M
from retire_bench.systems import LABELS, SYSTEMS

_COLORS = {"native": "#d62728", "native_stop_reading": "#ff7f0e", "retire": "#1f77b4"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def replay_plots(results: dict[str, list[Any]], out_dir: Path) -> list[Path]:
    """Write ``replay_timeline.png``; returns the paths written."""
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in SYSTEMS if results.get(n)]
    if not names:
        return []
    fig, axes = plt.subplots(
        2, len(names), figsize=(4.2 * len(names), 5.4), sharex=True, squeeze=False
    )
    peak = 1
    for col, name in enumerate(names):
        rec: M.RunRecord = results[name][0].record
        series = M.live_obsolete_series(rec)
        xs = [t - rec.start for t, _ in series]
        ys = [c for _, c in series]
        peak = max(peak, max(ys, default=0))
        ax = axes[0][col]
        ax.step(xs, ys, where="post", color=_COLORS.get(name, "k"), lw=1.2)
        for s in rec.versions:
            if s.retired_at is not None:
                ax.axvline(s.retired_at - rec.start, color="0.85", lw=0.5, zorder=0)
        ax.set_title(LABELS.get(name, name), fontsize=10)
        if col == 0:
            ax.set_ylabel("live obsolete\nexecutions")
        ax2 = axes[1][col]
        scopes = sorted({s.scope for s in rec.versions})
        cmap = plt.get_cmap("tab10")
        for key, pts in sorted(M.per_version_tokens(rec).items()):
            color = cmap(scopes.index(key[0]) % 10)
            tx = [t - rec.start for t, _, _ in pts]
            ty = [n for _, n, _ in pts]
            ax2.plot([tx[0], *tx], [0, *ty], color=color, lw=0.9, alpha=0.8)
            bad = [(t - rec.start, n) for t, n, cur in pts if not cur]
            if bad:
                ax2.scatter(*zip(*bad, strict=True), marker="x", color="red", s=18, zorder=3)
        ax2.set_xlabel("time since replay start (s)")
        if col == 0:
            ax2.set_ylabel("tokens read per version\n(x = obsolete)")
    for col in range(len(names)):
        axes[0][col].set_ylim(-0.2, peak + 0.8)
    fig.suptitle(
        "Replay of the bursty revision trace: obsolete work and per-version output", fontsize=10
    )
    fig.tight_layout()
    path = out_dir / "replay_timeline.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def handoff_plot(doc: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    from retire_bench.handoff import points

    cells = doc.get("points") or points(doc["cells"])  # the median of a cell's trials, min-max
    groups = sorted({(c["prompt_tokens"], c["prefix_fraction"]) for c in cells})
    systems = [s for s in ("native", "retire") if any(c["system"] == s for c in cells)]
    fig, axes = plt.subplots(2, len(groups), figsize=(3.3 * len(groups), 5.0), squeeze=False)
    for col, (length, frac) in enumerate(groups):
        for name in systems:
            pts = sorted(
                (c["pressure"], c)
                for c in cells
                if c["system"] == name
                and c["prompt_tokens"] == length
                and c["prefix_fraction"] == frac
            )
            for row, field in ((0, "reused_tokens"), (1, "ttft_steps")):
                got = [(x, c[field]) for x, c in pts if c[field]["median"] is not None]
                axes[row][col].errorbar(
                    [x for x, _ in got],
                    [v["median"] for _, v in got],
                    yerr=[
                        [v["median"] - v["min"] for _, v in got],
                        [v["max"] - v["median"] for _, v in got],
                    ],
                    fmt="o-",
                    ms=3,
                    capsize=2,
                    color=_COLORS[name],
                    label=LABELS[name],
                )
        common = pts[0][1]["certifiable_tokens"] if pts else 0
        axes[0][col].axhline(common, color="0.6", ls="--", lw=0.8)
        axes[0][col].set_title(f"prompt {length}, prefix {frac:.0%}", fontsize=9)
        axes[1][col].set_xlabel("co-tenant eviction pressure")
    axes[0][0].set_ylabel("successor tokens reused\n(dashed: reusable prefix)")
    axes[1][0].set_ylabel("successor TTFT\n(engine steps)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Handoff under cache pressure", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def goodput_curve(doc: dict[str, Any], path: Path) -> Path:
    """Current-version goodput against offered load (1 / trace time scale), one line per arm of
    a ``replay --system all`` document; the operating point is marked."""
    from retire_bench.curve import ARMS, LABELS

    plt = _plt()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    points = sorted(doc["curve"], key=lambda p: p["time_scale"])
    for arm in ARMS:
        xs = [1.0 / p["time_scale"] for p in points if p["goodput"].get(arm) is not None]
        ys = [p["goodput"][arm] for p in points if p["goodput"].get(arm) is not None]
        if xs:
            ax.plot(xs, ys, marker="o", label=LABELS[arm])
    op = doc["operating_point"]["time_scale"]
    if op:
        ax.axvline(1.0 / op, color="grey", linestyle=":", label=f"operating point (x{op:g})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("offered load: 1 / trace time scale (1 = the trace as recorded)")
    ax.set_ylabel("current-version goodput, tok/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
