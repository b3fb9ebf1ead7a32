"""ALIGN's choices: between two certifiable pages of one position, the newest retired version's
page, then the lowest id (the spec allows either, so only these tests pin the documented choice),
the chain going on past such a position; and when a chain is worth certifying (``AUTO``:
``min_reuse_blocks``, ``ALWAYS``: one block). Mutation testing found these unchecked."""

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


def test_a_tie_goes_to_the_lowest_page_id_and_the_chain_goes_on() -> None:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1, 2), ALWAYS))
    _write_block(r, 0, "a", 6)  # two participants of version 0 each fill block 0
    _write_block(r, 0, "b", 4)
    r.handle(rc.PageAllocated("s", 0, "a", 7, 1))  # and "a" fills block 1
    r.handle(rc.WriteAttempted("s", 0, "a", 7))
    r.handle(rc.WriterClosed(7, "digest-7"))
    out = r.handle(rc.Supersede("s", (1, 2, 3), ALWAYS))
    (pin,) = [c for c in out if isinstance(c, rc.PinCertified)]
    assert pin.certificate.pages == (4, 7)  # the lower id at block 0, then block 1


def _one_block_successor(contract: rc.Contract) -> list[rc.Command]:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "f", (1, 2), contract))
    _write_block(r, 0, "a", 3)
    return r.handle(rc.Supersede("s", (1, 9), contract))  # one block in common


def test_min_reuse_blocks_applies_to_auto_only() -> None:
    auto = _one_block_successor(rc.Contract(reuse=rc.ReusePolicy.AUTO, min_reuse_blocks=2))
    assert not [c for c in auto if isinstance(c, rc.PinCertified)]
    assert [c for c in auto if isinstance(c, rc.Admit)] == [rc.Admit("s", 1, 0, cold=True)]
    auto1 = _one_block_successor(rc.Contract(reuse=rc.ReusePolicy.AUTO, min_reuse_blocks=1))
    assert [c.certificate.pages for c in auto1 if isinstance(c, rc.PinCertified)] == [(3,)]
    always = _one_block_successor(rc.Contract(reuse=rc.ReusePolicy.ALWAYS, min_reuse_blocks=5))
    assert [c.certificate.pages for c in always if isinstance(c, rc.PinCertified)] == [(3,)]
    assert not [c for c in always if isinstance(c, rc.Admit)]  # admitted after the byte check


def test_the_certificate_says_what_each_certified_page_holds() -> None:
    r = rc.Retire()
    r.handle(rc.Submit("s", "t", "fp", (0, 5, 7), ALWAYS))  # block key 0 is a key like any other
    _write_block(r, 0, "a", 3)
    r.handle(rc.PageAllocated("s", 0, "a", 4, 1))
    r.handle(rc.WriteAttempted("s", 0, "a", 4))
    r.handle(rc.WriterClosed(4, "digest-4"))
    out = r.handle(rc.Supersede("s", (0, 5, 9), ALWAYS))
    (pin,) = [c for c in out if isinstance(c, rc.PinCertified)]
    gen = {p: r.state.pages[p].generation for p in (3, 4)}
    assert pin.certificate.entries == (
        rc.CertEntry(3, 0, gen[3], 0, "fp", "digest-3"),
        rc.CertEntry(4, 1, gen[4], 5, "fp", "digest-4"),
    )
