"""The clean reference the vLLM facade tests check their runs against (one per test module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retire_vllm.checker import Checker
from tests.vllm.support import build_reference, shutdown


@pytest.fixture(scope="module")
def checker() -> Iterator[Checker]:
    ref = build_reference(num_blocks=256)
    yield Checker(ref)
    shutdown(ref)
