"""Generates the parts of docs/protocol.md that must never be drawn by hand.

The state diagram comes from ``retire_core.table`` (every legal (state, event) pair, with the
next state where the table determines it); the event, command, reason and invariant lists come
from the classes, the reason enums and the spec themselves. ``python -m retire_checks.docgen``
rewrites the generated block between the markers in docs/protocol.md; a test fails when the
file is stale.
"""

from __future__ import annotations

import pathlib
import sys

import attrs

from retire_core import commands, events, reasons
from retire_core.table import NEXT_STATE, TABLE
from retire_spec.invariants import INVARIANTS, QUIESCENCE

BEGIN = "<!-- BEGIN GENERATED: python -m retire_checks.docgen -->"
END = "<!-- END GENERATED -->"
DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def state_diagram() -> str:
    lines = ["```mermaid", "stateDiagram-v2", "    [*] --> active: Submit"]
    self_loops: dict[str, list[str]] = {}
    for (state, kind), _handler in sorted(
        TABLE.items(), key=lambda kv: (kv[0][0].value if kv[0][0] else "", kv[0][1].__name__)
    ):
        if state is None:
            continue
        nxt = NEXT_STATE.get((state, kind), state.value)
        for target in nxt.split(" | "):
            if target == state.value:
                self_loops.setdefault(state.value, []).append(kind.__name__)
            else:
                lines.append(f"    {state.value} --> {target}: {kind.__name__}")
    for looped, names in sorted(self_loops.items()):
        lines.append(f"    {looped} --> {looped}: {', '.join(sorted(set(names)))}")
    lines.append("```")
    return "\n".join(lines)


def _fields(cls: type) -> str:
    return ", ".join(a.name for a in attrs.fields(cls))


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def generated() -> str:
    parts = [BEGIN, "", "### State diagram (from `retire_core/table.py`)", "", state_diagram(), ""]
    parts += ["### Legal (state, event) pairs", "", "| state | event | handler |", "|---|---|---|"]
    for (state, kind), handler in sorted(
        TABLE.items(), key=lambda kv: (kv[0][0].value if kv[0][0] else "", kv[0][1].__name__)
    ):
        parts.append(f"| {state.value if state else '(none)'} | `{kind.__name__}` | `{handler}` |")
    parts += ["", "Every other pair raises (see the error table below) and changes nothing.", ""]
    parts += ["### Events", "", "| event | fields | meaning |", "|---|---|---|"]
    for cls in (*events.SCOPE_EVENTS, *events.PAGE_EVENTS):
        parts.append(f"| `{cls.__name__}` | {_fields(cls)} | {_doc(cls)} |")
    parts += ["", "### Commands", "", "| command | fields | meaning |", "|---|---|---|"]
    for name in (
        "Publish",
        "Drop",
        "Fence",
        "AllowWrite",
        "FenceWrite",
        "PinCertified",
        "Adopt",
        "Unpin",
        "Admit",
        "Free",
    ):
        cls = getattr(commands, name)
        parts.append(f"| `{name}` | {_fields(cls)} | {_doc(cls)} |")
    parts += ["", "### Reasons (`retire_core/reasons.py`)", "", "| enum | values | meaning |"]
    parts.append("|---|---|---|")
    for family in (
        reasons.DropReason,
        reasons.FenceReason,
        reasons.ReleaseReason,
        reasons.UnpinReason,
    ):
        values = ", ".join(f"`{m.value}`" for m in family)
        parts.append(f"| `{family.__name__}` | {values} | {_doc(family)} |")
    parts += ["", "### Invariants (spec/invariants.py)", ""]
    for inv in INVARIANTS:
        parts.append(f"- **{inv.name}** — {inv.text}")
    parts += ["", "At quiescence (terminal states of a bounded run):", ""]
    for inv in QUIESCENCE:
        parts.append(f"- **{inv.name}** — {inv.text}")
    parts += ["", END]
    return "\n".join(parts)


def render(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC} lacks the generated-block markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + generated() + tail


def main() -> int:
    DOC.write_text(render(DOC.read_text()))
    print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
