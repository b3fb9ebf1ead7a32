"""The replay's console table: ``fmt`` (a figure or ``-``) and ``table`` (the systems side by
side with the paper's figures). What does not live here: running the replay and its JSON
(``replay``), the evaluation at load's own table (``curve``).
"""

from __future__ import annotations

import math
from typing import Any

from retire_bench.replay import PAPER
from retire_bench.systems import SYSTEMS


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


def table(doc: dict[str, Any]) -> str:
    """The side-by-side table (measured, plus the paper's figures for reference)."""
    names = [n for n in SYSTEMS if n in doc]
    rows = [
        ("obsolete tokens published", "obsolete_tokens", 0),
        ("peak live obsolete executions", "peak_live_obsolete", 0),
        ("mean live obsolete executions", "mean_live_obsolete", 2),
        ("cleanup ms, median", "cleanup_ms_median", 2),
        ("cleanup ms, p99", "cleanup_ms_p99", 2),
        ("final versions advanced", None, 0),
        ("current-version goodput tok/s", "goodput_tok_s", 1),
        ("TTFT of finals ms, median", "ttft_final_ms_median", 0),
        ("TTFT of finals ms, p90", "ttft_final_ms_p90", 0),
        ("obsolete tokens computed", "obsolete_tokens_computed", 0),
        ("engine step ms, median", "step_ms_median", 1),
        ("share of step in retire_core %", "retire_core_share_of_step", 2),
        ("  same core calls replayed warm %", "retire_core_share_of_step_warm", 2),
        ("share of step in integration %", "integration_share_of_step", 1),
        ("retire_core us per step", "retire_core_us_per_step", 0),
        ("  same core calls replayed warm, us", "retire_core_us_per_step_warm", 0),
        ("integration us per step", "integration_us_per_step", 0),
        ("vLLM add/abort inside steps us per step", "engine_api_us_per_step", 0),
        ("checker admitted", "admitted", 0),
        ("runs on a contended CPU", "contended_runs", 0),
    ]
    header = ["metric"] + [n for n in names] + ["paper native", "paper Retire"]
    lines = [header]
    for label, key, digits in rows:
        row = [label]
        for n in names:
            if key is None:
                row.append(f"{doc[n]['final_versions_advanced']}/{doc[n]['final_versions_total']}")
            elif key == "contended_runs":
                row.append(f"{doc[n].get(key)}/{doc[n].get('runs')}")
            else:
                value = doc[n].get(key)
                if "_share_of_step" in key and value is not None:
                    value = 100.0 * value
                row.append(fmt(value, digits))
        if key is None:
            row += ["3/9", "9/9"]
        else:
            row += [
                fmt(PAPER["native"].get(key), digits),
                fmt(PAPER["retire"].get(key), digits),
            ]
        lines.append(row)
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(header))]
    out = []
    for i, r in enumerate(lines):
        out.append(
            "  ".join(
                str(c).rjust(w) if j else str(c).ljust(w)
                for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    tail = [
        f"goodput ratio Retire / native abort+resubmit: {fmt(doc.get('goodput_ratio'), 2)}x "
        f"(paper 5.53x)",
        "goodput ratio Retire / native stop-reading: "
        f"{fmt(doc.get('goodput_ratio_vs_stop_reading'), 2)}x",
        f"checker admitted every run: {doc.get('checker_admitted')}",
    ]
    loads = [x for n in names for pair in doc[n].get("load_avg_1m", []) for x in pair]
    if loads:
        cpus = doc.get("machine", {}).get("cpus")
        tail.append(
            f"1-minute load average around the runs: {min(loads):.1f}-{max(loads):.1f} "
            f"on {cpus} CPUs (a load above the CPU count means other work competed)"
        )
    return "\n".join([*out, "", *tail])
