"""Generates the parts of docs/protocol.md that must never be drawn by hand.

The state diagram comes from ``retire_core.table`` (every legal (state, event) pair and the
next states its entry allows); the event, command, reason and invariant lists come
from the classes, the reason enums and the spec themselves. ``python -m retire_checks.docgen``
rewrites the generated block between the markers in docs/protocol.md; a test fails when the
file is stale.
"""

from __future__ import annotations

import pathlib
import sys

import attrs

from retire_core import commands, events, reasons
from retire_core.state import ScopeState
from retire_core.table import TABLE, Entry
from retire_spec.invariants import INVARIANTS, QUIESCENCE

BEGIN = "<!-- BEGIN GENERATED: python -m retire_checks.docgen -->"
END = "<!-- END GENERATED -->"
DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def _name(state: ScopeState | None) -> str:
    return "[*]" if state is None else state.value


def _rows() -> list[tuple[tuple[ScopeState | None, type], Entry]]:
    return sorted(
        TABLE.items(), key=lambda kv: (kv[0][0].value if kv[0][0] else "", kv[0][1].__name__)
    )


def state_diagram() -> str:
    """Every move the table allows: an arrow per (state, next state) labelled with the events
    that can take it, a self-loop per state with the events that leave it where it is."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for (state, kind), entry in _rows():
        for target in entry.next:
            arrows.setdefault((_name(state), _name(target)), []).append(kind.__name__)
    lines = ["```mermaid", "stateDiagram-v2"]
    moves = sorted(arrows.items(), key=lambda kv: (kv[0][0] == kv[0][1], kv[0]))
    for (source, dest), names in moves:
        lines.append(f"    {source} --> {dest}: {', '.join(sorted(names))}")
    lines.append("```")
    return "\n".join(lines)


def _fields(cls: type) -> str:
    return ", ".join(a.name for a in attrs.fields(cls))


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def generated() -> str:
    parts = [BEGIN, "", "### State diagram (from `retire_core/table.py`)", "", state_diagram(), ""]
    parts += ["### Legal (state, event) pairs", ""]
    parts += ["| state | event | handler | next states |", "|---|---|---|---|"]
    for (state, kind), entry in _rows():
        nxt = ", ".join("(forgotten)" if s is None else s.value for s in entry.next)
        parts.append(
            f"| {state.value if state else '(none)'} | `{kind.__name__}` "
            f"| `{entry.handler.__name__}` | {nxt} |"
        )
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
