"""Which of an ``open``'s two copies decides it (``early_opens.OpenCopies``), over every way the
two channels can deliver them: the ``open`` socket delivers one sender's copies in order but may
lose one (the listener drops it unread) or deliver one twice; utility calls come once each, in
any order, interleaved with the socket however the engine core's threads run. Each open must be
decided exactly once, each utility call answered with its open's decision, and nothing kept but
openings whose copy has not come. No vLLM here: the rule is plain bookkeeping."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retire_vllm.serving.early_opens import Copy, OpenCopies, copy_of

#: A delivery: ("copy", opening) off the socket, ("utility", opening) as the utility call.
Delivery = tuple[Literal["copy", "utility"], str]


@attrs.frozen
class Open:
    opening: str
    sender: str
    seq: int
    sent: bool  # the copy went to the socket (else the send was refused: only the utility call)


def deliver(copies: OpenCopies[str], opens: list[Open], schedule: list[Delivery]) -> list[str]:
    """Run ``schedule`` through ``copies`` as the engine side does: a copy that ``DECIDES`` is
    decided on the socket's thread; a utility call without the copy's decision decides itself.
    What went wrong (empty: nothing)."""
    by_id = {o.opening: o for o in opens}
    decisions: Counter[str] = Counter()
    answers: dict[str, str] = {}
    for channel, opening in schedule:
        o = by_id[opening]
        if channel == "copy":
            if copies.take_copy(opening, o.sender, o.seq) is Copy.DECIDES:
                decisions[opening] += 1
                copies.decided(opening, f"decision of {opening}")
        else:
            answer = copies.take_utility(opening, (o.sender, o.seq) if o.sent else None)
            if answer is None:
                decisions[opening] += 1
                answer = f"decision of {opening}"
            answers[opening] = answer
    problems = [f"{k} decided {n} times" for k, n in decisions.items() if n != 1]
    problems += [f"{o.opening} never decided" for o in opens if o.opening not in decisions]
    problems += [f"{k} answered {a!r}" for k, a in answers.items() if a != f"decision of {k}"]
    taken = [by_id[opening] for channel, opening in schedule if channel == "copy"]
    for k in copies.openings():
        o = by_id[k]
        if o in taken:
            problems.append(f"{k} still waits for its copy, which came")
        elif any(t.sender == o.sender and t.seq > o.seq for t in taken):
            problems.append(f"{k} still waits for its copy, which a later copy shows lost")
    if copies.decided_early:
        problems.append(f"decisions no utility call took: {copies.decided_early}")
    return problems


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[Open], list[Delivery]]:
    """Opens from one or two senders, numbered in the order sent; each copy sent or refused,
    and a sent one delivered, lost, or delivered twice (the second time later on); the socket
    keeps each sender's order, and the utility calls come in any order; the two interleave."""
    opens: list[Open] = []
    per_sender: dict[str, list[Delivery]] = {}
    twice: list[Open] = []
    for i in range(draw(st.integers(1, 7))):
        sender = draw(st.sampled_from(["a", "b"]))
        seq = sum(1 for o in opens if o.sender == sender) + draw(st.integers(0, 1))  # gaps
        fate = draw(st.sampled_from(["delivered", "lost", "twice", "refused"]))
        o = Open(f"open{i}", sender, seq, sent=fate != "refused")
        opens.append(o)
        if fate in ("delivered", "twice"):
            per_sender.setdefault(sender, []).append(("copy", o.opening))
        if fate == "twice":
            twice.append(o)
    for o in twice:  # the duplicate comes after its original, possibly after later copies too
        stream = per_sender[o.sender]
        at = draw(st.integers(stream.index(("copy", o.opening)) + 1, len(stream)))
        stream.insert(at, ("copy", o.opening))
    utility: list[Delivery] = draw(st.permutations([("utility", o.opening) for o in opens]))
    streams = [*per_sender.values(), utility]
    schedule: list[Delivery] = []
    while any(streams):
        stream = draw(st.sampled_from([s for s in streams if s]))
        schedule.append(stream.pop(0))
    return opens, schedule


@settings(max_examples=400, deadline=None)
@given(schedules())
def test_each_open_is_decided_once_however_its_copies_arrive(
    case: tuple[list[Open], list[Delivery]],
) -> None:
    opens, schedule = case
    assert deliver(OpenCopies(), opens, schedule) == []


def test_a_lost_copy_is_forgotten_when_a_later_copy_of_its_sender_comes() -> None:
    copies: OpenCopies[str] = OpenCopies()
    assert copies.take_utility("x", ("a", 0)) is None  # decided by its utility call
    assert list(copies.openings()) == ["x"]  # waiting for its copy
    assert copies.take_copy("y", "a", 1) is Copy.DECIDES  # x's copy would have come first
    assert "x" not in set(copies.openings()) and copies.lost == 1


def test_a_copy_delivered_again_changes_nothing() -> None:
    copies: OpenCopies[str] = OpenCopies()
    assert copies.take_copy("x", "a", 0) is Copy.DECIDES
    copies.decided("x", "decision")
    assert copies.take_utility("x", ("a", 0)) == "decision"
    assert copies.take_copy("x", "a", 0) is Copy.DUPLICATE  # a third copy: not decided again
    assert copies.take_utility("y", ("a", 1)) is None
    assert copies.take_copy("y", "a", 1) is Copy.LATE
    assert len(copies) == 0


class _NoDuplicateCheck(OpenCopies[str]):
    """Seeded bug: a copy the socket delivered before is taken as a first copy."""

    def take_copy(self, opening: str, sender: str, seq: int) -> Copy:
        self._highest.pop(sender, None)
        self.decided_early.pop(opening, None)
        return super().take_copy(opening, sender, seq)


class _WaitsForLostCopies(OpenCopies[str]):
    """Seeded bug: a utility call waits for its copy even when a later copy came first."""

    def take_copy(self, opening: str, sender: str, seq: int) -> Copy:
        waiting = dict(self._waiting.get(sender, {}))
        taken = super().take_copy(opening, sender, seq)
        lost = {n: k for n, k in waiting.items() if n < seq}
        if lost:
            self._waiting.setdefault(sender, {}).update(lost)
        return taken


@pytest.mark.parametrize(
    ("mutant", "opens", "schedule", "expect"),
    [
        (
            _NoDuplicateCheck,
            [Open("x", "a", 0, True)],
            [("copy", "x"), ("utility", "x"), ("copy", "x")],
            "x decided 2 times",
        ),
        (
            _WaitsForLostCopies,
            [Open("x", "a", 0, True), Open("y", "a", 1, True)],
            [("utility", "x"), ("copy", "y"), ("utility", "y")],  # x's copy lost
            "x still waits for its copy, which a later copy shows lost",
        ),
    ],
)
def test_the_check_catches_seeded_bugs(
    mutant: type[OpenCopies[str]], opens: list[Open], schedule: list[Delivery], expect: str
) -> None:
    assert deliver(OpenCopies(), opens, schedule) == []
    problems = deliver(mutant(), opens, schedule)
    assert problems and expect in problems[0], problems


def test_a_payload_without_a_well_formed_copy_number_is_not_a_copy() -> None:
    assert copy_of({"sender": "a", "seq": 3}) == ("a", 3)
    for bad in ({}, {"sender": "a"}, {"sender": 1, "seq": 3}, {"sender": "a", "seq": True}):
        assert copy_of(bad) is None
