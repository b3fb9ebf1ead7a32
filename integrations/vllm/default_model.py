"""The tiny default model that every vLLM test and benchmark of the project runs.

No model is ever downloaded: this module *builds* one, deterministically from a seed, and saves it
in Hugging Face layout so that vLLM can load it like any checkpoint.  It is a Qwen3 decoder with
random weights (hidden 128, 2 layers, 4 query heads / 2 KV heads, vocabulary 2048, 8192 positions),
initialised with std 0.1 so that greedy logits have clear gaps between the best and the second-best
token, plus a byte-level BPE tokenizer trained locally with `tokenizers` on generated text.  The
result lives in a cache directory named after a short hash of the recipe and the seed
(``<repo>/.cache/retire/default-model-<hash>`` unless ``$RETIRE_CACHE`` or ``cache_dir`` says
otherwise), is reused when complete, and is written atomically (temporary directory + rename).
``python -m retire_vllm.default_model [--seed N] [--size tiny|small|hybrid] [--cache-dir DIR]``
prints the path. ``--size small`` builds a larger model of the same recipe (hidden 512, 4 layers),
for measurements that need an engine step closer to a real model's (the overhead's share of step
time); ``--size hybrid`` a tiny Llama that mixes a sliding-window and a full-attention layer (two
KV cache groups in vLLM); the tiny model stays the default everywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

# Never talk to the hub, whatever the caller's environment says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: Bump when the recipe below changes in a way that changes the produced files.
RECIPE_VERSION: Final[int] = 1

VOCAB_SIZE: Final[int] = 2048
EOS_TOKEN: Final[str] = "<|endoftext|>"
INIT_STD: Final[float] = 0.1

#: Architecture parameters (transformers ``Qwen3Config`` keywords).
MODEL_CONFIG: Final[dict[str, Any]] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": INIT_STD,
    "hidden_act": "silu",
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}

#: Model sizes: changes to ``MODEL_CONFIG``. ``tiny`` is the default every test and benchmark
#: runs; ``small`` (about 14M parameters) only serves measurements that want a heavier step.
SIZES: Final[dict[str, dict[str, Any]]] = {
    "tiny": {},
    "small": {
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
    },
    # a Llama of the tiny shape whose first layer attends through a 64-token sliding window and
    # whose second attends to everything: vLLM builds two KV cache groups for it
    "hybrid": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64},
}
#: Architecture per size (the others are Qwen3, which cannot mix attention types in vLLM 0.32).
ARCHITECTURES: Final[dict[str, str]] = {"hybrid": "LlamaForCausalLM"}


def model_config(size: str = "tiny") -> dict[str, Any]:
    """``MODEL_CONFIG`` with the changes of ``size`` (ValueError for an unknown size)."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; known: {', '.join(SIZES)}")
    return {**MODEL_CONFIG, **SIZES[size]}


#: Files whose presence marks a complete model directory.
REQUIRED_FILES: Final[tuple[str, ...]] = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "retire_recipe.json",
)

_WORDS: Final[tuple[str, ...]] = (
    "the",
    "a",
    "plan",
    "agent",
    "tool",
    "call",
    "fails",
    "user",
    "interrupts",
    "branch",
    "loses",
    "request",
    "version",
    "scope",
    "page",
    "block",
    "cache",
    "prefix",
    "token",
    "output",
    "revise",
    "replace",
    "abort",
    "resume",
    "fence",
    "align",
    "reclaim",
    "advance",
    "commit",
    "publish",
    "worker",
    "engine",
    "queue",
    "frame",
    "receipt",
    "pin",
    "evict",
    "owner",
    "digest",
    "generation",
    "model",
    "search",
    "result",
    "answer",
    "question",
    "file",
    "read",
    "write",
    "list",
    "open",
    "close",
    "error",
    "retry",
    "succeeds",
    "step",
    "next",
    "then",
    "because",
    "if",
    "when",
    "and",
    "or",
    "not",
    "with",
    "from",
    "into",
    "over",
    "under",
    "before",
    "after",
    "while",
    "until",
)


def recipe(size: str = "tiny") -> dict[str, Any]:
    """Everything that determines the produced files, except the seed. (The tiny model's recipe
    has no size entry, so its hash, and its cache directory, predate the sizes.)"""
    out: dict[str, Any] = {
        "recipe_version": RECIPE_VERSION,
        "architecture": ARCHITECTURES.get(size, "Qwen3ForCausalLM"),
        "model_config": model_config(size),
        "init_std": INIT_STD,
        "tokenizer": {"kind": "byte-level-bpe", "vocab_size": VOCAB_SIZE, "eos": EOS_TOKEN},
    }
    if size != "tiny":
        out["size"] = size
    return out


def model_hash(seed: int = 0, size: str = "tiny") -> str:
    """Short, stable hash of the recipe and the seed (names the cache directory)."""
    blob = json.dumps({"recipe": recipe(size), "seed": seed}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def default_cache_root() -> Path:
    """``$RETIRE_CACHE`` if set, else ``<repo root>/.cache/retire``."""
    env = os.environ.get("RETIRE_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache" / "retire"


def is_complete(path: Path) -> bool:
    """True if ``path`` holds every file of a finished model directory."""
    return all((path / name).is_file() for name in REQUIRED_FILES)


def corpus(seed: int, n_lines: int = 4000) -> list[str]:
    """Deterministic pseudo-text for tokenizer training (words, digits, punctuation)."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(n_lines):
        n = rng.randint(4, 20)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(n), str(rng.randint(0, 9999)))
        line = " ".join(words)
        line = line[0].upper() + line[1:] + rng.choice((".", "?", "!", ":", ";", ","))
        lines.append(line)
    return lines


def _build_tokenizer(seed: int, out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer vocab {tok.get_vocab_size()} != {VOCAB_SIZE}")
    if tok.token_to_id(EOS_TOKEN) != MODEL_CONFIG["eos_token_id"]:
        raise RuntimeError("EOS token must have id 0")
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=None,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))


def _build_model(seed: int, out_dir: Path, size: str = "tiny") -> None:
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    llama = ARCHITECTURES.get(size) == "LlamaForCausalLM"
    config = (LlamaConfig if llama else Qwen3Config)(**model_config(size))
    config.dtype = torch.float32
    model_cls: Any = LlamaForCausalLM if llama else Qwen3ForCausalLM
    with torch.device("meta"):
        skeleton = model_cls(config)
    # Weights come from our own generator in sorted name order, not from transformers' init code,
    # so that they depend only on (seed, shapes) and not on library internals.
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, param in sorted(skeleton.state_dict().items()):
        if name.endswith("norm.weight"):
            state[name] = torch.ones(param.shape, dtype=torch.float32)
        elif name.endswith(".bias"):
            state[name] = torch.zeros(param.shape, dtype=torch.float32)
        else:
            state[name] = torch.randn(param.shape, generator=gen, dtype=torch.float32) * INIT_STD
    model = model_cls(config)
    missing, unexpected = model.load_state_dict(state, strict=True)
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: {missing=} {unexpected=}")
    model.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=MODEL_CONFIG["bos_token_id"],
        eos_token_id=MODEL_CONFIG["eos_token_id"],
        pad_token_id=MODEL_CONFIG["pad_token_id"],
        do_sample=False,
    ).save_pretrained(str(out_dir))


def ensure_default_model(cache_dir: Path | None = None, seed: int = 0, size: str = "tiny") -> Path:
    """Return the directory of the default model for ``seed`` (and ``size``), building it if
    absent.

    ``cache_dir`` is the parent directory (default: :func:`default_cache_root`).  Safe to call
    concurrently: each builder writes a private temporary directory and renames it into place;
    a loser of the race discards its copy.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    name = "default-model" if size == "tiny" else f"default-model-{size}"
    target = root / f"{name}-{model_hash(seed, size)}"
    if is_complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        _build_tokenizer(seed, tmp)
        _build_model(seed, tmp, size)
        (tmp / "retire_recipe.json").write_text(
            json.dumps({"recipe": recipe(size), "seed": seed}, indent=2, sort_keys=True) + "\n"
        )
        for child in tmp.iterdir():
            child.chmod(0o644)
        tmp.chmod(0o755)
        if target.exists() and not is_complete(target):
            shutil.rmtree(target)  # a stale partial directory from an older, non-atomic writer
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_complete(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m retire_vllm.default_model", description=__doc__
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    print(ensure_default_model(args.cache_dir, args.seed, args.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
