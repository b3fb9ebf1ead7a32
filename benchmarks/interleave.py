"""The replay's core calls again, each step's around a model's forward pass on any torch device.

The replay measures the core's in-step calls in the run and the same calls back to back
(``CoreTimer.warm_replay``). On this CPU the run costs about 2.7 times the warm figure: the
model's kernels evict the core's code and data from the CPU caches between calls (results.md
4.3). This benchmark measures that factor when the model runs on another device. It reads the
calls of one recorded Retire run (``retire replay --system retire --reps 1 --save-core-calls
PATH``) and replays them on a fresh core in one process, both ways, alternating: back to back,
and with one forward pass after each step's first call (where vLLM runs the model, between the
facade's ``after_schedule`` and ``before_commit``). The forward pass is a causal LM's decode
step -- a Hugging Face model directory (the tiny default model) or a Llama-shaped preset with
random weights, built on the device, so nothing is downloaded -- or (``--graph-gib``, GPU only)
a CUDA graph of matrix products reading as many weight bytes as a decode step of that size, so
that the CPU only waits. It reports the core's in-step time per step both ways and the median
forward pass. It needs torch and transformers, not vLLM, so it also runs on a GPU machine that
has no vLLM build. What it does not model: vLLM's own CPU work between the calls (scheduler,
sampler, output processing), so its share is of a bare decode step. The replay itself lives in
``replay.py``, the core's throughput in ``overhead.py``.

``python -m retire_bench.interleave CALLS [--device cuda] [--model DIR|default] [--llama 1b|8b]
[--graph-gib 16]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from retire_bench.systems import CoreCall, load_core_calls, replay_core_calls

# Llama-shaped presets (hidden, layers, attention heads, KV heads, MLP width); vocabulary 32,000.
LLAMA: Final[dict[str, tuple[int, int, int, int, int]]] = {
    "1b": (2048, 16, 32, 8, 8192),
    "8b": (4096, 32, 32, 8, 14336),
}
BATCH: Final[int] = 3  # the shipped trace's three scopes decode side by side
PROMPT_TOKENS: Final[int] = 128


class Decoder:
    """Greedy decoding of ``BATCH`` sequences, one token each per ``step()``, with the KV cache
    kept between steps; ``step()`` returns only once the device has finished the pass."""

    def __init__(self, model: Any, device: str, vocab: int) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.device = device
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(1, vocab, (BATCH, PROMPT_TOKENS), generator=gen).to(device)
        with torch.inference_mode():
            out = model(input_ids=prompt, use_cache=True)
        self.cache = out.past_key_values
        self.next_ids = out.logits[:, -1:].argmax(-1)
        self.tokens = PROMPT_TOKENS
        self._sync()

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def step(self) -> None:
        with self.torch.inference_mode():
            out = self.model(input_ids=self.next_ids, past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        self.next_ids = out.logits[:, -1:].argmax(-1)
        self.tokens += 1
        self._sync()


class GraphStep:
    """A decode step's weight traffic and nothing else: bf16 products of 4096 x 4096 matrices,
    ``gib`` GiB of them in all (16 GiB: an 8B model's weights, read once per token), with a batch
    of ``BATCH`` vectors, captured once as a CUDA graph and replayed per ``step()``. The CPU only
    launches the graph and waits, as in an engine that replays CUDA graphs for decoding."""

    def __init__(self, gib: float, device: str) -> None:
        import torch

        if not gib > 0:
            raise ValueError(f"a graph step must read some weights, not {gib} GiB")
        if not device.startswith("cuda"):
            raise ValueError("graph steps replay a CUDA graph: they need a CUDA device")
        self.torch = torch
        n = 4096
        count = max(1, int(gib * 2**30) // (n * n * 2))
        self.weights = [
            torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(count)
        ]
        self.x = torch.randn(n, BATCH, device=device, dtype=torch.bfloat16)
        self.out = torch.empty(n, BATCH, device=device, dtype=torch.bfloat16)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as CUDA graphs require
            self._products()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._products()
        torch.cuda.synchronize()

    def _products(self) -> None:
        for w in self.weights:
            self.torch.matmul(w, self.x, out=self.out)

    def step(self) -> None:
        self.graph.replay()
        self.torch.cuda.synchronize()


def build_model(spec: str, device: str) -> tuple[Any, int]:
    """``spec``: a Hugging Face model directory, ``default`` (the replay's tiny default model,
    built locally if absent), or ``llama-1b`` / ``llama-8b`` (random weights). bf16 on a GPU,
    fp32 on the CPU. Returns the model (eval mode, on ``device``) and its vocabulary size."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if spec == "default":
        from retire_vllm.default_model import ensure_default_model

        spec = str(ensure_default_model())

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if spec.startswith("llama-"):
        size = spec.removeprefix("llama-")
        if size not in LLAMA:
            raise ValueError(f"unknown preset {spec!r}: one of {sorted(LLAMA)}")
        hidden, layers, heads, kv_heads, mlp = LLAMA[size]
        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=mlp,
            max_position_embeddings=4096,
        )
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
        finally:
            torch.set_default_dtype(previous)
    else:
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
        model = model.to(device)
    model.eval()
    return model, int(model.config.vocab_size)


def measure(
    initial: Any,
    calls: Sequence[CoreCall],
    forward: Callable[[], None],
    reps: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The core's in-step seconds per step back to back (best of ``reps``, as the replay's warm
    figure) and with ``forward()`` after each step's first call (median of ``reps``), passes
    alternating, and the median forward pass."""
    steps = len({step for _, _, step, _ in calls if step})
    if not steps:
        raise ValueError("the recorded calls hold no step: record a run with steps")
    passes: list[float] = []
    forward_s: list[float] = []

    def timed_forward(step: int) -> None:
        t0 = clock()
        forward()
        forward_s.append(clock() - t0)

    for _ in range(max(1, reps)):
        warm = replay_core_calls(initial, calls, clock)
        interleaved = replay_core_calls(initial, calls, clock, timed_forward)
        passes.append(warm)
        passes.append(interleaved)
    warm_s = min(passes[0::2])
    interleaved_s = statistics.median(passes[1::2])
    forward_ms = statistics.median(forward_s) * 1e3
    core_us = interleaved_s / steps * 1e6
    return {
        "steps": steps,
        "core_us_per_step_interleaved": core_us,
        "core_us_per_step_warm": warm_s / steps * 1e6,
        "cold_factor": interleaved_s / warm_s if warm_s > 0 else None,
        "forward_ms_median": forward_ms,
        "core_share_of_forward": core_us / 1e3 / forward_ms if forward_ms > 0 else None,
    }


def run(calls_path: Path, models: Sequence[str], device: str, reps: int) -> dict[str, Any]:
    import torch

    initial, calls = load_core_calls(calls_path)
    doc: dict[str, Any] = {
        "calls": str(calls_path),
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "rows": [],
    }
    for spec in models:
        stepper: Decoder | GraphStep
        if spec.startswith("graph-"):
            stepper = GraphStep(float(spec.removeprefix("graph-").removesuffix("gib")), device)
        else:
            model, vocab = build_model(spec, device)
            stepper = Decoder(model, device, vocab)
            del model
        for _ in range(5):  # warm-up: kernels chosen, allocator primed
            stepper.step()
        row = {"model": spec, **measure(initial, calls, stepper.step, reps)}
        doc["rows"].append(row)
        del stepper
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return doc


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"core calls of {doc['calls']}, forward passes on {doc['device_name']} "
        f"(torch {doc['torch']})",
        f"{'model':<28} {'steps':>6} {'forward ms':>11} {'core us/step':>13} "
        f"{'warm us/step':>13} {'factor':>7} {'share':>7}",
    ]
    for r in doc["rows"]:
        lines.append(
            f"{Path(r['model']).name:<28} {r['steps']:>6} {r['forward_ms_median']:>11.3f} "
            f"{r['core_us_per_step_interleaved']:>13.1f} {r['core_us_per_step_warm']:>13.1f} "
            f"{r['cold_factor']:>7.2f} {100 * r['core_share_of_forward']:>6.2f}%"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retire_bench.interleave", description=__doc__)
    p.add_argument("calls", type=Path, help="a file written by retire replay --save-core-calls")
    p.add_argument("--device", default="cpu", help="torch device (cuda on a GPU machine)")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        help="a model directory, or 'default' for the tiny default model (repeatable)",
    )
    p.add_argument("--llama", action="append", default=[], choices=sorted(LLAMA))
    p.add_argument(
        "--graph-gib",
        action="append",
        type=float,
        default=[],
        help="a CUDA-graph step reading this many GiB of bf16 weights (16: an 8B model's decode)",
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    models = [
        *args.model,
        *(f"llama-{s}" for s in args.llama),
        *(f"graph-{g:g}gib" for g in args.graph_gib),
    ]
    if not models:
        p.error("name at least one --model, --llama or --graph-gib")
    if not args.calls.is_file():
        p.error(f"{args.calls}: no such file (write one with retire replay --save-core-calls)")
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if any(not g > 0 for g in args.graph_gib):
        p.error("--graph-gib must be above 0")
    doc = run(args.calls, models, args.device, args.reps)
    print(table(doc))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
