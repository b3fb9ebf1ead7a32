"""What a seeded bug is: the ``Mutant`` record and the small worlds mutants are judged in.

A ``Mutant`` names one seeded bug -- a patch of one ``retire_core`` decision (a *core* mutant) or
an alternative spec action table (a *spec* mutant) -- with the bug kind of issue 3 it seeds, the
explorer configurations it must show in and the checks that must each find it, and the patch
helper ``patched``. ``CONFIGS`` are the quick profile's configurations by name; ``SPEC_*`` are
the smaller spec-only worlds. What does not live here: the mutants themselves (``mutants_core``,
``mutants_commands``, ``mutants_spec``) and judging them (``mutants``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import attrs

from retire_checks.explorer import QUICK, Config
from retire_spec import actions as A
from retire_spec.schema import Bounds

CONFIGS: dict[str, Config] = {c.name: c for c in QUICK.configs}

# Small spec-only worlds (the spec explorer enumerates every action instance, the core's
# decisions included, so it needs less room than the explorer over the core).
SPEC_ONE = Config("spec-one", Bounds(1, 1, 1, 1, 1, 1, ((1,), (2,)), (0,)))
SPEC_TWO_PARTS = Config("spec-two-parts", Bounds(1, 2, 0, 1, 1, 1, ((1,), (2,)), (0,)))
SPEC_CHAIN = Config("spec-chain", Bounds(1, 1, 0, 1, 1, 2, ((1,), (2,)), (0,)))
SPEC_TENANTS = Config("spec-tenants", Bounds(2, 2, 0, 1, 1, 0, ((1,),), (0, 1)))
SPEC_TENANTS_REVISED = Config("spec-tenants-revised", Bounds(2, 1, 0, 1, 1, 1, ((1,),), (0, 1)))


@attrs.frozen(slots=True)
class Mutant:
    name: str
    kind: str  # the bug kind of issue 3 it seeds
    level: str  # "core" or "spec"
    description: str
    configs: tuple[Config, ...]
    patch: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    actions: dict[str, A.Action] | None = None
    # the checks that must each find it (``judge`` runs them whatever it is asked for): the
    # explorer, and Z3 for spec mutants; Hypothesis alone for a bug of the batch path, which
    # only the Hypothesis machine drives (``fuzz.LockstepMachine.engine_step``)
    judged_by: tuple[str, ...] = ()

    @property
    def required(self) -> tuple[str, ...]:
        if self.judged_by:
            return self.judged_by
        return ("explorer",) if self.level == "core" else ("explorer", "z3")

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The core as this mutant has it (a no-op for spec mutants)."""
        if self.patch is None:
            yield
            return
        with self.patch():
            yield


def patched(target: Any, name: str, value: Any) -> Callable[[], Any]:
    """A mutant's patch: ``target.name`` replaced by ``value`` while the mutant is active."""
    return lambda: mock.patch.object(target, name, value)
