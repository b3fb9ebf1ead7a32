"""The conversations benchmark's bookkeeping (no server): what a prefix cache could serve of a
turn's prompt (the previous turn's full blocks), the per-turn summary over conversations, and
the options it refuses."""

from __future__ import annotations

import pytest

from retire_bench.turns import main, reusable_tokens, summary
from retire_vllm.engine_config import BLOCK_SIZE


def test_reusable_tokens_are_the_previous_turns_full_blocks() -> None:
    assert BLOCK_SIZE == 32
    assert reusable_tokens(100, 64) == 160  # 164 tokens: five full blocks, the sixth rewritten
    assert reusable_tokens(184, 64) == 224
    assert reusable_tokens(31, 0) == 0
    assert reusable_tokens(32, 32) == 64


def _turn(prompt: int, cached: int, ttft: float, reusable: int) -> dict[str, float]:
    return {"prompt": prompt, "cached": cached, "ttft": ttft, "reusable": reusable}


def test_the_summary_is_per_turn_over_conversations() -> None:
    conversations = [
        [_turn(200, 0, 0.010, 0), _turn(304, 192, 0.030, 256)],
        [_turn(200, 0, 0.020, 0), _turn(304, 256, 0.050, 256)],
        [_turn(200, 32, 0.040, 0), _turn(304, 256, 0.040, 256)],
    ]
    first, second = summary(conversations, 2)
    assert first["turn"] == 1 and first["served_share"] is None  # nothing to reuse yet
    assert first["cached_tokens"] == pytest.approx(32 / 3)
    assert first["ttft_p50_ms"] == pytest.approx(20.0)
    assert second == {
        "turn": 2,
        "prompt_tokens": 304,
        "reusable_tokens": 256,
        "cached_tokens": pytest.approx(704 / 3),
        "served_share": pytest.approx(704 / 3 / 256),
        "ttft_p50_ms": pytest.approx(40.0),
    }


@pytest.mark.parametrize(
    "argv", [["--turns", "0"], ["--output", "0"], ["--clients", "0"], ["--message", "-1"]]
)
def test_bad_options_are_refused_before_any_server_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
