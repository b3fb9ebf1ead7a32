"""The tiny default model is deterministic, complete, idempotent and loadable offline."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from retire_vllm.default_model import (
    MODEL_CONFIG,
    REQUIRED_FILES,
    SIZES,
    VOCAB_SIZE,
    ensure_default_model,
    is_complete,
    model_config,
    model_hash,
    recipe,
)

pytestmark = pytest.mark.vllm


def _digest_dir(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_build_is_deterministic_and_idempotent(tmp_path: Path) -> None:
    a = ensure_default_model(tmp_path / "a", seed=0)
    b = ensure_default_model(tmp_path / "b", seed=0)
    assert a.name == b.name == f"default-model-{model_hash(0)}"
    assert is_complete(a) and sorted(REQUIRED_FILES) == sorted(p.name for p in a.iterdir())
    assert _digest_dir(a) == _digest_dir(b)
    # Reuse: no rebuild, same files, no temporary directories left behind.
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    t0 = time.perf_counter()
    assert ensure_default_model(tmp_path / "a", seed=0) == a
    assert time.perf_counter() - t0 < 1.0
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "a").iterdir()] == [a.name]


def test_other_seed_other_model(tmp_path: Path) -> None:
    a = ensure_default_model(tmp_path, seed=0)
    c = ensure_default_model(tmp_path, seed=1)
    assert a != c
    assert _digest_dir(a)["model.safetensors"] != _digest_dir(c)["model.safetensors"]


def test_sizes_name_their_own_recipe_and_leave_the_tiny_one_alone() -> None:
    # The tiny recipe (and so its cache directory) is the one from before sizes existed.
    assert "size" not in recipe("tiny") and recipe("tiny")["model_config"] == MODEL_CONFIG
    assert model_hash(0, "tiny") == model_hash(0)
    small = model_config("small")
    assert small == {**MODEL_CONFIG, **SIZES["small"]}
    assert small["hidden_size"] > MODEL_CONFIG["hidden_size"]
    assert recipe("small")["size"] == "small"
    assert model_hash(0, "small") != model_hash(0)
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        model_config("huge")


def test_small_size_builds_its_own_directory(tmp_path: Path) -> None:
    small = ensure_default_model(tmp_path, seed=0, size="small")
    assert small.name == f"default-model-small-{model_hash(0, 'small')}" and is_complete(small)
    config = json.loads((small / "config.json").read_text())
    assert config["hidden_size"] == SIZES["small"]["hidden_size"]
    assert config["num_hidden_layers"] == SIZES["small"]["num_hidden_layers"]


def test_incomplete_directory_is_rebuilt(tmp_path: Path) -> None:
    target = tmp_path / f"default-model-{model_hash(0)}"
    target.mkdir()
    (target / "config.json").write_text("{}")
    assert ensure_default_model(tmp_path, seed=0) == target
    assert is_complete(target)
    assert json.loads((target / "config.json").read_text())["hidden_size"] == 128


def test_model_and_tokenizer_load_offline(tmp_path: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = ensure_default_model(tmp_path, seed=0)
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.model_type == "qwen3" and cfg.max_position_embeddings >= 8192
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 4, 2)
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == VOCAB_SIZE
    text = "The agent calls the tool; the tool fails, retry 42!"
    ids = tok.encode(text)
    assert tok.decode(ids) == text  # byte-level BPE round-trips
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    assert logits.shape[-1] == MODEL_CONFIG["vocab_size"]
    assert float(gaps.median()) > 0.05  # greedy choices are not coin flips


def test_cli_prints_path(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "retire_vllm.default_model", "--cache-dir", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert Path(out.stdout.strip()) == tmp_path / f"default-model-{model_hash(0)}"
