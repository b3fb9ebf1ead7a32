"""``python -m retire_bench.gpu_digest [--json PATH]``: the KV block digest on vLLM's GPU layouts.

On CUDA when there is one (else on the CPU, and the report says so), for every layout of
:data:`retire_vllm.kv_digest.LAYOUTS`: builds a few layers of KV tensors in that layout (vLLM
0.32's stride-ordered ``[B, H, N, C]`` views, the older K/V-first, block-first and MLA shapes),
computes the block digests on the device (torch integer ops; only a few int64 per block and layer
come back), checks that they equal the reference digests computed from host copies of the same
blocks and, across the layouts of one family, that the same K/V values give the same digests;
corrupts one element of one block (what the campaign's page fault does) and checks that exactly
that block's digest changes; and times the device digest (and the default engine: numpy on a CPU
tensor) against the host-copy digest, reported as ratios (no thresholds: numbers for reading).
Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from retire_vllm import kv_digest as kd

VLLM_LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")


def layer_in_layout(values: Any, name: str, layers: int = 2, layer: int = 0) -> Any:
    """One layer's KV cache holding ``values`` (logical ``[B, H, N, 2 * D]``, K then V) in layout
    ``name`` of :data:`~retire_vllm.kv_digest.LAYOUTS`. vLLM 0.32 layouts: layer ``layer`` of a
    ``[L, B, H, N, C]`` allocation in that stride order (the name spells it: ``BLHNC`` puts ``B``
    outermost), the other layers holding other values; older shapes: a contiguous tensor."""
    import torch

    if name in VLLM_LAYOUTS:
        order = tuple("LBHNC".index(c) for c in name)
        logical = torch.stack([values + i for i in range(layers)])
        logical[layer] = values
        physical = logical.permute(*order).contiguous()
        return physical.permute(*[order.index(i) for i in range(5)])[layer]
    d = values.shape[-1] // 2
    k, v = values[..., :d].transpose(1, 2), values[..., d:].transpose(1, 2)  # [B, N, H, D]
    if name == "flash_attn_kv_first":
        return torch.stack([k, v]).contiguous()
    if name == "flashinfer_block_first":
        return torch.stack([k, v], dim=1).contiguous()
    return values[:, 0].contiguous()  # mla: [B, N, C]


def _time(fn: Any, sync: Any, repeat: int) -> float:
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeat


def run(
    blocks: int, heads: int, tokens: int, head_size: int, layers: int, repeat: int
) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    g = torch.Generator().manual_seed(0)
    values = [
        torch.randn(blocks, heads, tokens, 2 * head_size, generator=g).to(torch.bfloat16)
        for _ in range(layers)
    ]
    ids = list(range(0, blocks, 3))
    report: dict[str, Any] = {
        "device": str(torch.cuda.get_device_name(0)) if cuda else "cpu",
        "on_cuda": cuda,
        "note": "" if cuda else "no CUDA device: the device digest ran on CPU tensors",
        "shape": {"blocks": blocks, "heads": heads, "tokens": tokens, "head_size": head_size},
        "layers": layers,
        "dtype": "bfloat16",
        "digested_blocks": len(ids),
        "layouts": {},
    }
    family_digests: dict[str, set[tuple[str, ...]]] = {"vllm": set(), "legacy": set()}
    ok = True
    for name in kd.LAYOUTS:
        caches = [layer_in_layout(v.to(device), name) for v in values]
        dev = kd.block_digests(caches, ids, engine="torch")
        ref = kd.host_reference_digests(caches, ids)
        if name != "mla":
            family = "vllm" if name in VLLM_LAYOUTS else "legacy"
            family_digests[family].add(tuple(dev[b] for b in ids))
        victim = ids[len(ids) // 2]
        cell = kd.select_block(caches[-1], victim)
        flat_index = tuple(s // 2 for s in cell.shape)
        old = cell[flat_index].item()
        cell[flat_index] = old + 1.0
        after = kd.block_digests(caches, ids, engine="torch")
        changed = [b for b in ids if after[b] != dev[b]]
        cell[flat_index] = old
        t_dev = _time(lambda c=caches: kd.block_digests(c, ids, engine="torch"), sync, repeat)
        t_default = _time(lambda c=caches: kd.block_digests(c, ids), sync, repeat)
        t_host = _time(lambda c=caches: kd.host_reference_digests(c, ids), sync, repeat)
        row = {
            "backend": kd.LAYOUTS[name].backend,
            "tensor_shape": list(caches[0].shape),
            "contiguous": bool(caches[0].is_contiguous()),
            "equals_host_reference": dev == ref,
            "one_element_changed_only_its_block": changed == [victim],
            "device_ms": round(t_dev * 1e3, 3),
            "host_copy_ms": round(t_host * 1e3, 3),
            "device_over_host": round(t_dev / t_host, 3),
            "default_engine_ms": round(t_default * 1e3, 3),
            "default_over_host": round(t_default / t_host, 3),
        }
        ok = ok and dev == ref and changed == [victim]
        report["layouts"][name] = row
    report["same_values_same_digests"] = {f: len(s) == 1 for f, s in family_digests.items()}
    report["ok"] = bool(ok and all(report["same_values_same_digests"].values()))
    return report


def table(report: dict[str, Any]) -> str:
    lines = [
        f"device: {report['device']}" + (f"  ({report['note']})" if report["note"] else ""),
        f"{report['layers']} layers, {report['dtype']}, block {report['shape']}, "
        f"{report['digested_blocks']} blocks digested",
        f"{'layout':24} {'shape':22} {'=ref':5} {'1 blk':5} {'dev ms':>8} {'host ms':>8} "
        f"{'dev/host':>8} {'dflt/host':>9}",
    ]
    for name, r in report["layouts"].items():
        lines.append(
            f"{name:24} {r['tensor_shape']!s:22} {r['equals_host_reference']!s:5} "
            f"{r['one_element_changed_only_its_block']!s:5} {r['device_ms']:8.3f} "
            f"{r['host_copy_ms']:8.3f} {r['device_over_host']:8.3f} {r['default_over_host']:9.3f}"
        )
    lines.append(
        "dev: torch integer ops on the tensors' device; dflt: block_digests' default engine "
        "(numpy on a CPU tensor, torch elsewhere); host: a host copy of each whole block"
    )
    lines.append(f"same values, same digests across layouts: {report['same_values_same_digests']}")
    lines.append("ok" if report["ok"] else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retire_bench.gpu_digest", description=__doc__)
    ap.add_argument("--json", default=None, help="write the report as JSON to this path")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16, help="tokens per block")
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    report = run(args.blocks, args.heads, args.tokens, args.head_size, args.layers, args.repeat)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
