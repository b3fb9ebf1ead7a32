"""KV cache groups in the core: a page is allocated in a group (``PageAllocated.group``) of the
version's contract (``Contract.kv_windows``); a cut of ``k`` blocks needs, in a full-attention
group, every block before it and, in a sliding-window group of ``w`` blocks, only the last ``w``
(``handoff.required_slots``); ALIGN certifies the longest cut whose every required page is
certifiable, RESUME adopts the longest cut whose required pages all passed the byte check, and
``Admit`` names the cut in blocks, not the pages adopted. One group (the default contract)
behaves, and logs, exactly as before groups."""

from __future__ import annotations

import pytest

import retire_core as rc
from retire_core.handoff import best_cut, required_slots

SLIDING = rc.Contract(kv_windows=(0, 2))  # full attention, and a two-block sliding window


def test_a_cut_reads_all_of_full_attention_and_the_window_of_a_sliding_group() -> None:
    assert required_slots((0,), 3) == [(0, 0), (0, 1), (0, 2)]
    assert required_slots((0, 2), 3) == [(0, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert required_slots((0, 2), 1) == [(0, 0), (1, 0)]
    assert required_slots((3,), 2) == [(0, 0), (0, 1)]  # the window reaches block 0
    assert required_slots((0, 1), 0) == []


@pytest.mark.parametrize(
    "present, windows, n, cut",
    [
        ({(0, 0), (0, 1), (0, 3)}, (0,), 4, 2),  # full attention: up to the first gap
        ({(0, 0), (0, 1)}, (0,), 1, 1),  # never past the context
        ({(0, i) for i in range(4)} | {(1, 2), (1, 3)}, (0, 2), 4, 4),  # window at the end
        ({(0, i) for i in range(4)} | {(1, 1), (1, 2)}, (0, 2), 4, 3),  # ... or lower
        ({(0, i) for i in range(4)} | {(1, 0), (1, 2)}, (0, 2), 4, 1),  # no two in a row
        ({(0, i) for i in range(4)}, (0, 2), 4, 0),  # a group with nothing: no cut
        ({(0, 0), (1, 2), (1, 3)}, (0, 2), 4, 0),  # full stops at 1: no sliding block 0
    ],
)
def test_the_best_cut_is_the_longest_whose_every_required_slot_is_present(
    present: set[tuple[int, int]], windows: tuple[int, ...], n: int, cut: int
) -> None:
    assert best_cut(present, windows, n) == cut
    assert set(required_slots(windows, cut)) <= present


def _predecessor(sliding_positions: tuple[int, ...]) -> rc.Retire:
    """Scope ``s`` at version 0 over four blocks: full-attention pages 0-3 at positions 0-3,
    and sliding-window pages 10+i at ``sliding_positions`` (the engine freed the others),
    every one written full and closed; its participant ``a`` still runs."""
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2, 3, 4), SLIDING))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    pages = [(i, i, 0) for i in range(4)] + [(10 + i, i, 1) for i in sliding_positions]
    for page, position, group in pages:
        core.handle(rc.PageAllocated("s", 0, "a", page, position, group))
        core.handle(rc.WriteAttempted("s", 0, "a", page, True))
        core.handle(rc.WriterClosed(page, f"d{page}"))
    return core


def _revise(core: rc.Retire) -> tuple[list[rc.Command], list[dict[str, object]]]:
    """Version 1 shares three blocks with version 0, then the predecessor's receipt comes in:
    the commands of both steps, and the fields of the supersede's ``certify`` transitions."""
    out = core.handle(rc.Supersede("s", (1, 2, 3, 9), SLIDING))
    certified = [dict(t.args) for t in rc.per_page(core.last_transitions) if t.action == "certify"]
    return out + core.handle(rc.Receipt("s", 0, "a")), certified


def test_align_certifies_the_full_prefix_and_only_the_sliding_window_before_the_cut() -> None:
    core = _predecessor((1, 2, 3))
    out, certified = _revise(core)
    (pin,) = [c for c in out if isinstance(c, rc.PinCertified)]
    slots = [(e.group, e.position, e.page) for e in pin.certificate.entries]
    assert slots == [(0, 0, 0), (0, 1, 1), (1, 1, 11), (0, 2, 2), (1, 2, 12)]
    assert [c.get("group", 0) for c in certified] == [0, 0, 1, 0, 1]
    report = rc.AdoptionReport("s", 1, tuple(rc.PageDigest(p, f"d{p}") for _, _, p in slots))
    out = core.handle(report)
    (adopt,) = [c for c in out if isinstance(c, rc.Adopt)]
    assert adopt.pages == (0, 1, 11, 2, 12)
    assert rc.Admit("s", 1, 3, False) in out  # the cut in blocks, not the five pages
    adopted = [dict(t.args) for t in rc.per_page(core.last_transitions) if t.action == "adopt"]
    assert [a.get("group", 0) for a in adopted] == [0, 0, 1, 0, 1]


def test_a_sliding_group_without_its_window_allows_no_cut() -> None:
    core = _predecessor((2, 3))  # block 1 of the sliding group is gone: a cut of 3 needs it
    out, _ = _revise(core)
    assert not any(isinstance(c, rc.PinCertified) for c in out)
    assert rc.Admit("s", 1, 0, True) in out


@pytest.mark.parametrize(
    "bad_page, cut",
    [
        (12, 0),  # the window's last block: no shorter cut has the sliding blocks it needs
        (2, 0),  # a full-attention block: the cut falls to 2, whose window (0, 1) is gone
    ],
)
def test_a_failed_byte_check_falls_back_to_the_longest_cut_still_valid(
    bad_page: int, cut: int
) -> None:
    core = _predecessor((1, 2, 3))
    (pin,) = [c for c in _revise(core)[0] if isinstance(c, rc.PinCertified)]
    digests = tuple(
        rc.PageDigest(e.page, "changed" if e.page == bad_page else e.digest)
        for e in pin.certificate.entries
    )
    out = core.handle(rc.AdoptionReport("s", 1, digests))
    assert rc.Admit("s", 1, cut, False) in out
    (unpin,) = [c for c in out if isinstance(c, rc.Unpin)]
    assert sorted(unpin.pages) == sorted(pin.certificate.pages)
    assert unpin.reason == rc.ReleaseReason.DIGEST_MISMATCH


def test_a_page_of_a_group_the_contract_does_not_name_is_refused_and_changes_nothing() -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    before = core.fingerprint()
    with pytest.raises(rc.ContractError, match="KV cache group 1"):
        core.handle(rc.PageAllocated("s", 0, "a", 7, 0, 1))
    assert core.fingerprint() == before


@pytest.mark.parametrize("windows", [(), (0, -1), (True,), [0], (0, 1.5)])
def test_a_contract_with_malformed_windows_is_refused(windows: object) -> None:
    with pytest.raises(rc.ContractError, match="kv_windows"):
        rc.Contract(kv_windows=windows)  # type: ignore[arg-type]


def test_a_negative_group_is_a_malformed_event() -> None:
    with pytest.raises(rc.MalformedIdError, match="group"):
        rc.PageAllocated("s", 0, "a", 7, 0, -1)


@pytest.mark.parametrize(
    "contract, group, logged",
    [
        (SLIDING, 1, {"group": 1}),  # a second group's page says which group
        (rc.DEFAULT_CONTRACT, 0, {}),  # one group: the line reads as before groups
    ],
)
def test_an_allocation_logs_its_group_only_when_it_is_not_the_first(
    contract: rc.Contract, group: int, logged: dict[str, int]
) -> None:
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "f", (1, 2), contract))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 7, 1, group))
    (allocate,) = core.last_transitions
    fields = {"page": 7, "participant": "a", "position": 1, "inheritable": True}
    assert dict(allocate.args) == {**fields, **logged}
    assert core.state.pages[7].group == group
