"""``retire_bench.interleave``: the recorded core calls replayed around forward passes.

The replay logic itself (``replay_core_calls``: order, divergence, where ``between`` runs) is
tested in ``test_bench_metrics.py``; here, what ``measure`` makes of it and the decode step it
interleaves (a real Hugging Face model, tiny, built and saved locally)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import recorded_core_run


def test_measure_runs_one_forward_per_step_and_pass() -> None:
    from retire_bench.interleave import measure

    timer = recorded_core_run()
    assert timer.calls is not None
    forwards: list[int] = []
    row = measure(timer._initial, timer.calls, lambda: forwards.append(1), reps=3)
    assert row["steps"] == 1
    assert len(forwards) == 3  # one per recorded step, in each of the three interleaved passes
    assert row["core_us_per_step_warm"] > 0 and row["core_us_per_step_interleaved"] > 0
    outside = [c for c in timer.calls if not c[2]]
    with pytest.raises(ValueError, match="no step"):
        measure(timer._initial, outside, lambda: None)


@pytest.mark.vllm  # needs torch/transformers, which only the vLLM extras install
def test_decoder_decodes_one_token_per_sequence_per_step(tmp_path: Path) -> None:
    """A model directory is loaded as the benchmark loads the default model, and each ``step``
    extends every sequence's KV cache by exactly one token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from retire_bench.interleave import BATCH, PROMPT_TOKENS, Decoder, build_model

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    model, vocab = build_model(str(tmp_path), "cpu")
    assert vocab == 64
    decoder = Decoder(model, "cpu", vocab)
    assert decoder.cache.get_seq_length() == PROMPT_TOKENS
    for _ in range(3):
        decoder.step()
    assert decoder.tokens == PROMPT_TOKENS + 3
    assert decoder.cache.get_seq_length() == PROMPT_TOKENS + 3
    assert tuple(decoder.next_ids.shape) == (BATCH, 1)
    with pytest.raises(ValueError, match="unknown preset"):
        build_model("llama-2t", "cpu")


@pytest.mark.vllm  # needs torch/transformers, which only the vLLM extras install
def test_bad_arguments_are_refused_before_any_model_is_built(tmp_path: Path) -> None:
    from retire_bench.interleave import GraphStep, main

    timer = recorded_core_run()
    calls = tmp_path / "calls.pkl"
    timer.save_calls(calls)
    for argv in (
        [str(calls)],  # no model named
        [str(tmp_path / "missing.pkl"), "--model", "default"],
        [str(calls), "--model", "default", "--reps", "0"],
        [str(calls), "--graph-gib", "0"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
    with pytest.raises(ValueError, match="some weights"):
        GraphStep(-1.0, "cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        GraphStep(1.0, "cpu")
