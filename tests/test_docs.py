"""docs/protocol.md's generated block must match the transition table and the spec."""

from __future__ import annotations

import pytest

from retire_checks import docgen


def test_protocol_doc_is_generated_from_the_table() -> None:
    text = docgen.DOC.read_text()
    assert docgen.render(text) == text, "run: python -m retire_checks.docgen"
    assert "stateDiagram-v2" in text and "aligning --> active: AdoptionReport" in text


def test_stale_doc_is_detected() -> None:
    text = docgen.DOC.read_text()
    # the exit a hand-kept table once missed (a writer closing completes ALIGN)
    line = "aligning --> active: AdoptionReport, Receipt, Supersede, WriterClosed"
    assert line in text
    stale = text.replace(line, "aligning --> active: AdoptionReport")
    assert docgen.render(stale) != stale


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(ValueError):
        docgen.render("no markers here")
