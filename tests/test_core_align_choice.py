"""ALIGN's choice between two certifiable pages of one position: the newest retired version's
page (then the lowest id). The spec allows either, so only this test pins the documented choice
(mutation testing found it unchecked)."""

from __future__ import annotations

import retire_core as rc

ALWAYS = rc.Contract(reuse=rc.ReusePolicy.ALWAYS)
NEVER = rc.Contract(reuse=rc.ReusePolicy.NEVER)


def _write_block(r: rc.Retire, version: int, participant: str, page: int) -> None:
    r.handle(rc.ParticipantStarted("s", version, participant))
    r.handle(rc.PageAllocated("s", version, participant, page, 0))
    r.handle(rc.WriteAttempted("s", version, participant, page))
    r.handle(rc.WriterClosed(page, f"digest-{page}"))


def test_the_newest_retired_versions_page_is_certified() -> None:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1, 2), ALWAYS))
    _write_block(r, 0, "a", 2)  # version 0 fills block 0 in page 2 (and keeps running)
    r.handle(rc.Supersede("s", (1, 3), NEVER))  # version 1 is cold: it fills its own block 0
    _write_block(r, 1, "b", 5)
    out = r.handle(rc.Supersede("s", (1, 4), ALWAYS))
    (pin,) = [c for c in out if isinstance(c, rc.PinCertified)]
    # version 1's page, although page 2 (lower id, version 0) is also eligible
    assert pin.certificate.pages == (5,)
    assert {p: r.state.pages[p].version for p in (2, 5)} == {2: 0, 5: 1}
