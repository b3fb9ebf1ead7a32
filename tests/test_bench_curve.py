"""``replay --system all`` without an engine: the operating-point rule and the JSON's shape.

Synthetic run records go through the same ``metrics`` and ``curve.results_json`` code the real
evaluation uses; no timing is asserted.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from retire_bench import curve
from retire_bench import metrics as M
from retire_bench.reference import Admission
from retire_bench.trace_sources import BurstyParams, generate_bursty
from retire_vllm.api import Delivery


def test_the_operating_point_is_the_time_scale_closest_to_half_busy() -> None:
    assert curve.pick_operating_point({0.25: 0.95, 0.5: 0.7, 1.0: 0.45, 2.0: 0.2}) == 1.0
    assert curve.pick_operating_point({0.5: 0.6, 1.0: 0.4}) == 1.0  # a tie: the larger scale
    assert curve.pick_operating_point({0.5: None, 1.0: 0.9}) == 1.0
    assert curve.pick_operating_point({}) is None
    assert "half busy" in curve.OPERATING_POINT_RULE


def _run(arm: str, goodput_tokens: int, ttft_s: float, util: float) -> tuple[Any, ...]:
    span = M.VersionSpan("s0", 0, 0.0, final=True, prompt_tokens=8, max_tokens=goodput_tokens)
    reads = (
        M.Read(Delivery("s0", 0, (1,), False, ttft_s), ttft_s),
        M.Read(Delivery("s0", 0, (2,) * (goodput_tokens - 1), True, 1.0), 1.0),
    )
    record = M.RunRecord(arm, 0.0, 1.0, reads, (span,))
    m = M.compute(record)
    m["engine_utilisation"] = util
    return record, m, Admission(True, (), "harness")


def test_the_json_has_every_arm_the_curve_and_the_ratios() -> None:
    trace = generate_bursty(0, BurstyParams(duration_s=4.0, prompt_tokens=64, max_new_tokens=8))
    runs = {}
    for scale, util in ((0.5, 0.8), (1.0, 0.45)):
        for arm, tokens, ttft in (
            ("inprocess_abort", 40, 0.1),
            ("http_abort", 40, 0.1),
            ("let_run", 10, 0.5),
            ("stop_reading", 20, 0.2),
            ("retire", 40, 0.05),
        ):
            runs[(scale, arm)] = [_run(arm, tokens, ttft, util)]
    config = curve.LoadConfig(time_scales=(0.5, 1.0), model_path="m")
    doc = curve.results_json(trace, config, runs)
    for key in curve.TOP_KEYS:
        assert key in doc
    assert set(doc["arms"]) == set(curve.ARMS)
    for arm in curve.ARMS:
        for key in curve.ARM_KEYS:
            assert key in doc["arms"][arm], (arm, key)
    assert [p["time_scale"] for p in doc["curve"]] == [0.5, 1.0]
    assert set(doc["curve"][0]["goodput"]) == set(curve.ARMS)
    assert doc["operating_point"]["time_scale"] == 1.0  # Retire's 0.45 is nearer half busy
    assert doc["operating_point"]["rule"] == curve.OPERATING_POINT_RULE
    assert set(doc["goodput_ratio_vs"]) == set(curve.ARMS) - {"retire"}
    assert (
        doc["goodput_ratio_vs"]["let_run"]
        == doc["arms"]["retire"]["goodput_tok_s"] / (doc["arms"]["let_run"]["goodput_tok_s"])
    )
    assert doc["ttft_ratio_vs"]["let_run"] == 10.0
    assert doc["checker_admitted"] is True
    assert doc["targets"]["ttft_ratio_vs_let_run"]["met"] is False


def test_a_rejected_run_or_a_server_problem_clears_checker_admitted() -> None:
    trace = generate_bursty(0, BurstyParams(duration_s=4.0, prompt_tokens=64, max_new_tokens=8))
    rec, m, _ = _run("retire", 8, 0.1, 0.5)
    runs = {(1.0, "retire"): [(rec, m, Admission(False, ("bad",), "harness"))]}
    config = curve.LoadConfig(time_scales=(1.0,), model_path="m")
    assert curve.results_json(trace, config, runs)["checker_admitted"] is False
    runs = {(1.0, "retire"): [(rec, m, Admission(True, (), "harness"))]}
    assert (
        curve.results_json(trace, config, runs, ["core log rejected"])["checker_admitted"] is False
    )


def test_servers_and_the_in_process_engine_get_the_same_settings(tmp_path: Path) -> None:
    import json

    model = tmp_path
    cfg = {
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "num_hidden_layers": 4,
    }
    (model / "config.json").write_text(json.dumps(cfg))
    over = curve.engine_overrides(str(model), 100, 4)
    assert over["kv_cache_memory_bytes"] == 100 * 2 * 4 * 32 * 4 * 64 * 4
    opts = curve.server_options(str(model), 100, 4)
    value = {a: b for a, b in itertools.pairwise(opts) if a.startswith("--")}
    assert value["--max-num-seqs"] == "4"
    assert value["--num-gpu-blocks-override"] == "100"
    assert value["--kv-cache-memory-bytes"] == str(over["kv_cache_memory_bytes"])
    assert "--enforce-eager" in opts


def test_the_servers_logs_are_kept_where_the_run_names(tmp_path: Path) -> None:
    """The servers run in a short temporary directory (vLLM's IPC sockets); their console and
    core logs are copied to ``server_logs`` (the demo: ``OUT/servers``), nothing else."""
    tmp, keep = tmp_path / "t", tmp_path / "out" / "servers"
    for rel, text in [
        ("retire/retire.log", "console"),
        ("retire/retire-core.jsonl", "{}"),
        ("stock/stock.log", "stock console"),
        ("retire/socket-abc", ""),
    ]:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    assert curve._keep_logs(tmp, None) == tmp
    assert not keep.exists()
    assert curve._keep_logs(tmp, keep) == keep
    kept = sorted(str(p.relative_to(keep)) for p in keep.rglob("*") if p.is_file())
    assert kept == ["retire/retire-core.jsonl", "retire/retire.log", "stock/stock.log"]
    assert (keep / "stock" / "stock.log").read_text() == "stock console"
