"""The execution contract a version runs under.

A contract says what the successor requires of inherited state: the numerical mode (inherited
pages must have been computed in the same mode, which is part of the configuration fingerprint),
the output equivalence required against a clean run, the reuse policy that decides whether
certified handoff is worth it, and the engine's KV cache groups: for each group, how many blocks
before the cut a successor's layers read (``kv_windows``; 0: all of them, full attention; a
sliding window of ``W`` tokens reads ``ceil((W - 1) / block_size)``). The contract is data; the
decision it feeds is made in ``handoff``.
"""

from __future__ import annotations

import enum

import attrs

from retire_core.errors import ContractError


class ReusePolicy(enum.Enum):
    AUTO = "auto"  # reuse when at least ``min_reuse_blocks`` certified blocks are available
    ALWAYS = "always"  # reuse whatever can be certified
    NEVER = "never"  # cold successor: independent cache generation, nothing pinned


def _check_min_blocks(_: object, __: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ContractError(f"min_reuse_blocks must be a non-negative int, got {value!r}")


def _check_windows(_: object, __: object, value: tuple[int, ...]) -> None:
    if (
        not isinstance(value, tuple)
        or not value
        or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in value)
    ):
        raise ContractError(
            f"kv_windows must be a non-empty tuple of non-negative ints (0: full attention), "
            f"got {value!r}"
        )


@attrs.frozen(slots=True)
class Contract:
    reuse: ReusePolicy = ReusePolicy.AUTO
    min_reuse_blocks: int = attrs.field(default=1, validator=_check_min_blocks)
    numerical_mode: str = "fp32-greedy"
    equivalence: str = "exact"
    kv_windows: tuple[int, ...] = attrs.field(default=(0,), validator=_check_windows)

    @property
    def allows_reuse(self) -> bool:
        return self.reuse is not ReusePolicy.NEVER


DEFAULT_CONTRACT = Contract()
COLD_CONTRACT = Contract(reuse=ReusePolicy.NEVER)
