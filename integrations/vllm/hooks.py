"""Every vLLM symbol the Retire integration relies on, and a checker that they still exist.

The integration reaches into vLLM internals that are not a public API (engine core, scheduler,
KV cache manager, block pool, output processor, workers).  :data:`HOOKS` lists each of them once
-- module, attribute path, kind, and the parameter names we call it with -- grouped by the use
they serve (research items (a)-(g) of ``docs/vllm_research.md``).  :func:`check_hooks` imports
each module with ``importlib``, resolves the attribute and compares ``inspect.signature`` (or
the dataclass / msgspec fields, or the ``self.<name>`` assignments of instance attributes) and
returns one line per missing or mismatched hook, so an upgrade of vLLM fails loudly in
``tests/vllm/test_hooks.py`` instead of silently at run time.  The pinned version is
:data:`VLLM_VERSION`.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

VLLM_VERSION: Final[str] = "0.32.0"


class Kind(StrEnum):
    """How a hook is checked."""

    CALLABLE = "callable"  # function / method / class: parameters checked by signature
    FIELD = "field"  # dataclass, msgspec or pydantic field, or class-level annotation
    INSTANCE_ATTR = "instance_attr"  # ``self.<name> = ...`` in the class (or a base) source
    MEMBER = "member"  # any attribute that must exist (enum member, constant, property)


@dataclass(frozen=True)
class Hook:
    """One vLLM symbol: ``module`` + dotted ``path`` inside it.

    For ``CALLABLE`` hooks ``params`` are the parameter names we pass (``self`` excluded); they
    must appear in the signature in this relative order.  For ``FIELD``/``INSTANCE_ATTR`` hooks
    the last path component is the field/attribute name and the rest is the owning class.
    """

    module: str
    path: str
    kind: Kind = Kind.CALLABLE
    params: tuple[str, ...] = ()
    use: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}:{self.path}"


_C, _F, _I, _M = Kind.CALLABLE, Kind.FIELD, Kind.INSTANCE_ATTR, Kind.MEMBER

_ENGINE = "vllm.v1.engine.llm_engine"
_CORE = "vllm.v1.engine.core"
_SCHED = "vllm.v1.core.sched.scheduler"
_STM = "vllm.v1.core.single_type_kv_cache_manager"
_QUEUE = "vllm.v1.core.sched.request_queue"
_KVC = "vllm.distributed.kv_transfer.kv_connector.v1.base"
_SO = "vllm.v1.core.sched.output"
_MU = "vllm.model_executor.models.utils"
_MC = "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"
_KVM = "vllm.v1.core.kv_cache_manager"
_COORD = "vllm.v1.core.kv_cache_coordinator"
_POOL = "vllm.v1.core.block_pool"
_UTIL = "vllm.v1.core.kv_cache_utils"
_SPEC = "vllm.v1.kv_cache_interface"
_OUT = "vllm.v1.engine.output_processor"
_ASYNC = "vllm.v1.engine.async_llm"
_MP = "vllm.v1.executor.multiproc_executor"

HOOKS: Final[tuple[Hook, ...]] = (
    # --- version and engine construction (engine_config.py) ---------------------------------
    Hook("vllm", "__version__", _M, use="pinned version"),
    Hook("vllm", "LLMEngine", _M, use="in-process engine"),
    Hook(_ENGINE, "LLMEngine.from_engine_args", _C, ("engine_args", "usage_context"), "build"),
    Hook(_ENGINE, "LLMEngine.add_request", _C, ("request_id", "prompt", "params"), "submit"),
    Hook(_ENGINE, "LLMEngine.step", _C, (), "manual stepping (a)"),
    Hook(_ENGINE, "LLMEngine.abort_request", _C, ("request_ids", "internal"), "native abort"),
    Hook(_ENGINE, "LLMEngine.has_unfinished_requests", _C, (), "drain loop"),
    Hook(_ENGINE, "LLMEngine.output_processor", _I, use="output gate (e)"),
    Hook(_ENGINE, "LLMEngine.engine_core", _I, use="in-process core (a)"),
    *(
        Hook("vllm.engine.arg_utils", f"EngineArgs.{name}", _F, use="engine kwargs")
        for name in (
            "model",
            "tokenizer",
            "dtype",
            "block_size",
            "kv_cache_memory_bytes",
            "num_gpu_blocks_override",
            "enforce_eager",
            "enable_prefix_caching",
            "seed",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "disable_log_stats",
            "tensor_parallel_size",
            "distributed_executor_backend",
            "scheduler_cls",
            "kv_events_config",
        )
    ),
    Hook("vllm.v1.engine.core_client", "InprocClient.engine_core", _I, use="core access (a)"),
    Hook(
        "vllm.v1.engine.input_processor",
        "InputProcessor.assign_request_id",
        _C,
        ("request",),
        "internal id = <external>-<8 hex>",
    ),
    # --- engine core and scheduler (a, f) ----------------------------------------------------
    Hook(_CORE, "EngineCore.scheduler", _I, use="(a)"),
    Hook(_CORE, "EngineCore.model_executor", _I, use="(b, g)"),
    Hook(_CORE, "EngineCore.step", _C, (), "(a) schedule/execute/update"),
    Hook(_CORE, "EngineCore.abort_requests", _C, ("request_ids",), "(f) revoke"),
    Hook(_CORE, "EngineCore.add_request", _C, ("request", "request_wave"), "(a)"),
    Hook(_CORE, "EngineCore.collective_rpc", _C, ("method", "timeout", "args", "kwargs"), "(g)"),
    Hook(_CORE, "EngineCore.__init__", _C, ("vllm_config",), "several engines: registration"),
    Hook(_CORE, "EngineCore.shutdown", _C, (), "several in-process engines"),
    Hook(_CORE, "cleanup_dist_env_and_memory", _C, ("shutdown_ray",), "several engines"),
    Hook("vllm.config.scheduler", "SchedulerConfig.scheduler_cls", _F, use="(f) subclass"),
    Hook("vllm.config.scheduler", "SchedulerConfig.get_scheduler_cls", _C, (), "(f)"),
    Hook(
        _SCHED,
        "Scheduler.__init__",
        _C,
        (
            "vllm_config",
            "kv_cache_config",
            "structured_output_manager",
            "block_size",
            "hash_block_size",
            "mm_registry",
            "include_finished_set",
            "log_stats",
        ),
        "(f)",
    ),
    Hook(_SCHED, "Scheduler.schedule", _C, ("throttle_prefills",), "(f)"),
    Hook(
        _SCHED,
        "Scheduler.update_from_output",
        _C,
        ("scheduler_output", "model_runner_output"),
        "(f) commit gate",
    ),
    Hook(_SCHED, "Scheduler.finish_requests", _C, ("request_ids", "finished_status"), "(f)"),
    Hook(_SCHED, "Scheduler.shutdown", _C, (), "serving: the core log's last lines"),
    Hook(
        _SCHED,
        "Scheduler._preempt_request",
        _C,
        ("request", "timestamp", "drop_stale_output"),
        "a preemption drops the version's pages (VersionPreempted)",
    ),
    Hook(_SCHED, "Scheduler.add_request", _C, ("request",), "(f)"),
    Hook(_SCHED, "Scheduler._free_request", _C, ("request", "delay_free_blocks"), "(f)"),
    Hook(_SCHED, "Scheduler._free_blocks", _C, ("request",), "(f)"),
    Hook(_SCHED, "Scheduler.requests", _I, use="(a) live requests by internal id"),
    Hook(_SCHED, "Scheduler.running", _I, use="(a)"),
    Hook(_SCHED, "Scheduler.waiting", _I, use="(a)"),
    Hook(_SCHED, "Scheduler.kv_holding_waiting", _I, use="pause: withheld while waiting"),
    Hook(_QUEUE, "RequestQueue.remove_requests", _C, ("requests",), "pause: withheld"),
    Hook(_QUEUE, "RequestQueue.prepend_requests", _C, ("requests",), "pause: put back"),
    Hook(_SCHED, "Scheduler.kv_cache_manager", _I, use="(a)"),
    Hook("vllm.v1.core.sched.output", "SchedulerOutput.num_scheduled_tokens", _F, use="(f)"),
    # speculative decoding: the step's last positions hold these drafts; the commit
    # (``update_from_output``) lowers ``Request.num_computed_tokens`` by the rejected ones
    Hook(
        "vllm.v1.core.sched.output",
        "SchedulerOutput.scheduled_spec_decode_tokens",
        _F,
        use="draft writes (observe.schedule_events)",
    ),
    Hook("vllm.v1.request", "Request.block_hashes", _I, use="(a) chained full-block hashes"),
    Hook("vllm.v1.request", "Request.cache_salt", _I, use="serving: salt set at admission"),
    Hook("vllm.v1.request", "Request.update_block_hashes", _C, (), "serving: hashes again"),
    Hook("vllm.v1.request", "Request.num_computed_tokens", _I, use="(a) writer boundary"),
    Hook("vllm.v1.request", "Request.status", _I, use="(a)"),
    Hook("vllm.v1.request", "Request.client_index", _I, use="(f) output routing"),
    Hook("vllm.v1.request", "Request.is_finished", _C, (), "(f)"),
    Hook("vllm.v1.request", "RequestStatus.FINISHED_ABORTED", _M, use="(f)"),
    Hook("vllm.v1.engine", "EngineCoreOutput.request_id", _F, use="(e, f) frame"),
    Hook("vllm.v1.engine", "EngineCoreOutput.new_token_ids", _F, use="(e, f)"),
    Hook("vllm.v1.engine", "EngineCoreOutput.finish_reason", _F, use="(e, f)"),
    Hook("vllm.v1.engine", "EngineCoreOutputs.outputs", _F, use="(e, f)"),
    Hook("vllm.v1.engine", "FinishReason.ABORT", _M, use="(f) terminal frame"),
    # --- the serving path (retire serve: docs/serving.md) --------------------------------------
    Hook(
        _CORE, "EngineCoreProc._handle_client_request", _C, ("request_type", "request"), "utility"
    ),
    Hook(_CORE, "EngineCoreProc.output_queue", _I, use="serving: a fence's terminal output"),
    Hook("vllm.plugins", "load_general_plugins", _C, (), "serving: the utility method"),
    Hook("vllm.v1.engine.async_llm", "AsyncLLM.from_vllm_config", _C, ("vllm_config",), "serve"),
    Hook("vllm.v1.engine.async_llm", "AsyncLLM.engine_core", _I, use="serving: utility calls"),
    Hook(
        "vllm.v1.engine.core_client",
        "AsyncMPClient.call_utility_async",
        _C,
        ("method",),
        "serving: the one utility call",
    ),
    Hook("vllm.v1.engine", "EngineCoreOutput.stop_reason", _F, use="serving: fence marker"),
    Hook("vllm.sampling_params", "SamplingParams.extra_args", _F, use="serving: scope, version"),
    Hook("vllm.sampling_params", "SamplingParams.clone", _C, (), "serving: stamped params"),
    Hook("vllm.entrypoints.launchers.cli_args", "make_arg_parser", _C, ("parser",), "serve"),
    Hook(
        "vllm.entrypoints.launchers.cli_args",
        "FrontendArgs.middleware",
        _F,
        use="serving: scopes on the endpoints",
    ),
    Hook(
        "vllm.entrypoints.launchers.api_server.entry",
        "build_and_serve",
        _C,
        ("engine_client", "listen_address", "sock", "args"),
        "serve: vLLM's own app",
    ),
    Hook("vllm.entrypoints.launchers.launcher", "setup_server", _C, ("args",), "serve"),
    Hook("vllm.outputs", "CompletionOutput.stop_reason", _F, use="serving: fence marker"),
    # --- the serving path's digests within the step (serving/step_digests.py) ----------------
    Hook(
        "vllm.config",
        "KVTransferConfig",
        _C,
        ("kv_connector", "kv_role", "kv_connector_module_path"),
        "serve: the connector installed",
    ),
    Hook(
        _KVC,
        "KVConnectorBase_V1.__init__",
        _C,
        ("vllm_config", "role", "kv_cache_config"),
        "the connector built in each process",
    ),
    Hook(_KVC, "KVConnectorBase_V1.requires_kv_delivery", _M, use="step digests: none owed"),
    Hook(_KVC, "KVConnectorBase_V1.build_connector_meta", _C, ("scheduler_output",), "down"),
    Hook(_KVC, "KVConnectorBase_V1.register_kv_caches", _C, ("kv_caches",), "the layers"),
    Hook(_KVC, "KVConnectorBase_V1.wait_for_save", _C, (), "after the forward: digest"),
    Hook(_KVC, "KVConnectorBase_V1.build_connector_worker_meta", _C, (), "up: the digests"),
    Hook(_KVC, "KVConnectorBase_V1._get_connector_metadata", _C, (), "the step's blocks"),
    Hook(_KVC, "KVConnectorWorkerMetadata.aggregate", _C, ("other",), "ranks in rank order"),
    Hook(_KVC, "SupportsHMA.request_finished_all_groups", _C, ("request", "block_ids"), "HMA on"),
    Hook("vllm.v1.outputs", "KVConnectorOutput.kv_connector_worker_meta", _F, use="up"),
    Hook("vllm.v1.outputs", "ModelRunnerOutput.kv_connector_output", _F, use="up"),
    Hook(_SO, "SchedulerOutput.kv_connector_metadata", _F, use="down: the step's blocks"),
    Hook(_MU, "extract_layer_index", _C, ("layer_name",), "the model runner's layer order"),
    # the CPU cores vLLM reserves with no connector (step_digests.keep_cpu_reservation)
    Hook("vllm.utils.ompmultiprocessing", "OMPProcessManager.reserve_cpu_num", _I, use="cores"),
    Hook("vllm.platforms", "CpuArchEnum.X86", _M, use="serve: the CPU reservation per worker"),
    # beside a connector of the user's (step_digests.with_step_digests and _ours)
    Hook("vllm.config", "KVTransferConfig.kv_connector_extra_config", _F, use="children"),
    Hook("vllm.config", "KVTransferConfig.has_connector", _C, ("connector_name",), "installed?"),
    Hook(_MC, "MultiConnector", _C, ("vllm_config", "role", "kv_cache_config"), "composition"),
    Hook(
        _MC,
        "MultiConnector.get_num_new_matched_tokens",
        _C,
        ("request", "num_computed_tokens"),
        "scoped requests load no external KV",
    ),
    Hook(_MC, "MultiKVConnectorMetadata.metadata", _F, use="down: one per child, in order"),
    Hook(_MC, "MultiKVConnectorWorkerMetadata.metadata", _F, use="up: one per child"),
    # a request's last step, known at its schedule (observe.ends_by_length, as check_stop)
    Hook("vllm.v1.request", "Request.max_tokens", _I, use="step digests: ends by length"),
    Hook("vllm.v1.request", "Request.num_tokens", _M, use="step digests: ends by length"),
    Hook("vllm.v1.request", "Request.num_output_tokens", _M, use="step digests: ends by length"),
    # --- KV cache manager and block pool (a, c, d) -------------------------------------------
    Hook(_KVM, "KVCacheManager.coordinator", _I, use="(a)"),
    Hook(_KVM, "KVCacheManager.block_pool", _I, use="(a)"),
    Hook(_KVM, "KVCacheManager.get_computed_blocks", _C, ("request",), "(c) prefix hit"),
    Hook(
        _KVM,
        "KVCacheManager.allocate_slots",
        _C,
        ("request", "num_new_tokens", "num_new_computed_tokens", "new_computed_blocks"),
        "(c)",
    ),
    Hook(_KVM, "KVCacheManager.free", _C, ("request",), "(c)"),
    Hook(_KVM, "KVCacheManager.get_blocks", _C, ("request_id",), "(a)"),
    Hook(_KVM, "KVCacheManager.get_block_ids", _C, ("request_id",), "(a)"),
    Hook(_KVM, "KVCacheManager.cache_blocks", _C, ("request", "num_computed_tokens"), "(c)"),
    Hook(_KVM, "KVCacheManager.evict_blocks", _C, ("block_ids",), "(b) repair"),
    Hook(_KVM, "KVCacheManager.reset_prefix_cache", _C, (), "(c) leak check"),
    Hook(_COORD, "KVCacheCoordinator.get_blocks", _C, ("request_id",), "(a)"),
    Hook(_COORD, "KVCacheCoordinator.single_type_managers", _I, use="(a) one per KV cache group"),
    Hook(
        _STM,
        "SingleTypeKVCacheManager.req_to_blocks",
        _I,
        use="(a) a request's block table in one group",
    ),
    Hook(_STM, "FullAttentionManager", _M, use="(a) append-only lists (APPEND_ONLY_MANAGERS)"),
    Hook(_STM, "SlidingWindowManager", _M, use="(a) append-only lists (APPEND_ONLY_MANAGERS)"),
    Hook(
        _STM,
        "SlidingWindowManager.remove_skipped_blocks",
        _C,
        ("request_id", "processed_computed_tokens"),
        "(a) a passed block becomes the null block: PageUnreferenced (observe.schedule_events)",
    ),
    # --- KV cache groups: which blocks before a cut a successor reads (contract kv_windows) ---
    Hook(_SPEC, "KVCacheConfig.kv_cache_groups", _F, use="groups"),
    Hook(_SPEC, "KVCacheConfig.prefix_cache_retention_interval", _F, use="groups: dense"),
    Hook("vllm.config.cache", "CacheConfig.prefix_cache_retention_interval", _F, use="groups"),
    Hook(_SPEC, "KVCacheGroupSpec.kv_cache_spec", _F, use="groups"),
    Hook(_SPEC, "KVCacheSpec.block_size", _F, use="groups: one block size"),
    Hook(_SPEC, "FullAttentionSpec", _M, use="groups: window 0"),
    Hook(_SPEC, "MLAAttentionSpec", _M, use="groups: window 0"),
    Hook(_SPEC, "SlidingWindowSpec.sliding_window", _F, use="groups: ceil((W-1)/block) blocks"),
    Hook(_SPEC, "SlidingWindowSpec.extra_retained_tokens", _F, use="groups: refused unless 0"),
    Hook(
        _COORD,
        "KVCacheCoordinator.find_longest_cache_hit",
        _C,
        ("block_hashes", "max_cache_hit_length"),
        "(c)",
    ),
    Hook(_POOL, "BlockPool.blocks", _I, use="(a) block id -> KVCacheBlock"),
    Hook(_POOL, "BlockPool.free_block_queue", _I, use="(a, d) LRU"),
    Hook(_POOL, "BlockPool.cached_block_hash_to_block", _I, use="(a)"),
    Hook(_POOL, "BlockPool.null_block", _I, use="(a) a sliding window's passed positions"),
    Hook(_POOL, "BlockPool.get_cached_block", _C, ("block_hash", "kv_cache_group_ids"), "(c)"),
    Hook(_POOL, "BlockPool.touch", _C, ("blocks",), "(c) pin"),
    Hook(_POOL, "BlockPool.free_blocks", _C, ("ordered_blocks",), "(c) unpin"),
    Hook(_POOL, "BlockPool.get_new_blocks", _C, ("num_blocks",), "(d) reallocation"),
    Hook(_POOL, "BlockPool._maybe_evict_cached_block", _C, ("block",), "(d) eviction"),
    Hook(_POOL, "BlockPool.evict_blocks", _C, ("block_ids",), "(b) repair"),
    Hook(_POOL, "BlockPool.get_num_free_blocks", _C, (), "(a)"),
    Hook(_POOL, "BlockPool.take_events", _C, (), "(d) KV events"),
    Hook(_POOL, "BlockPool.reset_prefix_cache", _C, (), "(c)"),
    Hook(_UTIL, "FreeKVCacheBlockQueue.fake_free_list_head", _I, use="(d) LRU head"),
    Hook(_UTIL, "FreeKVCacheBlockQueue.num_free_blocks", _I, use="(a)"),
    Hook(_UTIL, "FreeKVCacheBlockQueue.popleft_n", _C, ("n",), "(d)"),
    Hook(_UTIL, "FreeKVCacheBlockQueue.remove", _C, ("block",), "(c)"),
    Hook(_UTIL, "KVCacheBlock.block_id", _F, use="(a)"),
    Hook(_UTIL, "KVCacheBlock.ref_cnt", _F, use="(c)"),
    Hook(_UTIL, "KVCacheBlock.block_hash", _M, use="(a) full+cached marker"),
    Hook(_UTIL, "KVCacheBlock.is_null", _F, use="(a)"),
    Hook(_UTIL, "KVCacheBlock.next_free_block", _F, use="(d)"),
    Hook("vllm.distributed.kv_events", "BlockStored.block_hashes", _F, use="(d)"),
    Hook("vllm.distributed.kv_events", "BlockRemoved.block_hashes", _F, use="(d)"),
    Hook("vllm.config.kv_events", "KVEventsConfig.enable_kv_cache_events", _F, use="(d)"),
    # --- worker side (b, g) -------------------------------------------------------------------
    Hook("vllm.v1.executor.uniproc_executor", "UniProcExecutor.driver_worker", _I, use="(b)"),
    Hook(
        "vllm.v1.executor.abstract",
        "Executor.collective_rpc",
        _C,
        ("method", "timeout", "args", "kwargs"),
        "(g) receipts",
    ),
    Hook(
        "vllm.v1.executor.multiproc_executor",
        "MultiprocExecutor.collective_rpc",
        _C,
        ("method", "timeout", "args", "kwargs", "non_block", "unique_reply_rank"),
        "(g)",
    ),
    # a worker process that dies: vLLM's monitor thread marks the executor failed and shuts it
    # down, waking the reader (observe.collective -> EngineDeadError); the fault's kill target
    Hook(_MP, "MultiprocExecutor.is_failed", _I, use="a worker died (EngineDeadError)"),
    Hook(_MP, "MultiprocExecutor.start_worker_monitor", _C, ("inline",), "worker death"),
    Hook(_MP, "MultiprocExecutor.workers", _I, use="worker processes by rank (exit codes)"),
    Hook(_MP, "WorkerProcHandle.proc", _F, use="the rank's process (faults.rank_pid)"),
    Hook(_MP, "WorkerProcHandle.rank", _F, use="the rank's process (faults.rank_pid)"),
    Hook("vllm.v1.worker.worker_base", "WorkerWrapperBase.worker", _I, use="(b)"),
    Hook("vllm.v1.worker.worker_base", "WorkerBase.rank", _I, use="(g) receipt"),
    Hook("vllm.v1.worker.cpu_worker", "CPUWorker.model_runner", _I, use="(b)"),
    Hook("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.kv_caches", _I, use="(b)"),
    Hook(
        "vllm.v1.attention.backends.cpu_attn",
        "CPUAttentionBackend.supported_kv_cache_layouts",
        _C,
        (),
        "(b) layout LBHNC",
    ),
    Hook("vllm.v1.kv_cache_layout", "KVCacheLayout.LBHNC", _M, use="(b)"),
    # GPU layouts read by kv_digest.LAYOUTS: every one a [B, H, N, C] view per layer
    *(
        Hook("vllm.v1.kv_cache_layout", f"KVCacheLayout.{name}", _M, use="(b) GPU layout")
        for name in ("LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
    ),
    Hook(
        "vllm.v1.worker.utils",
        "allocate_kv_cache",
        _C,
        ("kv_cache_config", "device", "layout", "kernel_block_sizes"),
        "(b) [B, H, N, C] views",
    ),
    # --- output path (e) ------------------------------------------------------------------------
    Hook(
        _OUT,
        "OutputProcessor.process_outputs",
        _C,
        ("engine_core_outputs", "engine_core_timestamp", "iteration_stats"),
        "(e) frame gate",
    ),
    Hook(_OUT, "OutputProcessor.abort_requests", _C, ("request_ids", "internal"), "(e)"),
    Hook(
        _OUT,
        "OutputProcessor.add_request",
        _C,
        ("request", "prompt", "parent_req", "request_index", "queue"),
        "(e)",
    ),
    Hook(_OUT, "OutputProcessor.request_states", _I, use="(e)"),
    Hook(_OUT, "OutputProcessor.external_req_ids", _I, use="(e) external -> internal ids"),
    Hook(_OUT, "RequestState.queue", _I, use="(e) collector"),
    Hook(_OUT, "RequestState.external_req_id", _I, use="(e)"),
    Hook(_OUT, "RequestOutputCollector.put", _C, ("output",), "(e) merge point"),
    Hook(_OUT, "RequestOutputCollector.get", _C, (), "(e)"),
    Hook(_OUT, "RequestOutputCollector.get_nowait", _C, (), "(e)"),
    Hook(_OUT, "RequestOutputCollector.output", _I, use="(e) merged unread output"),
    Hook(_OUT, "RequestOutputCollector.ready", _I, use="(e)"),
    # (with data parallelism a scoped request runs on its scope's engine: data_parallel_rank)
    Hook(
        _ASYNC,
        "AsyncLLM.generate",
        _C,
        ("prompt", "sampling_params", "request_id", "data_parallel_rank"),
        "(e), dp",
    ),
    # data parallelism: a scope's engine (wire.affinity) gets its calls
    Hook("vllm.v1.engine.core_client", "MPClient.core_engines", _I, use="dp: engines by rank"),
    Hook(
        "vllm.v1.engine.core_client",
        "AsyncMPClient._call_utility_async",
        _C,
        ("method", "args", "engine"),
        "dp: a scope call to its engine",
    ),
    Hook(
        "vllm.v1.engine.core_client",
        "AsyncMPClient.call_utility_all_async",
        _C,
        ("method", "args"),
        "dp: calls without a scope",
    ),
    Hook("vllm.config.parallel", "ParallelConfig.data_parallel_index", _F, use="dp: log path"),
    Hook(
        "vllm.config.parallel",
        "ParallelConfig.reconfigure_for_independent_dp_rank",
        _C,
        (),
        "dp: a dense model's engine core forgets the DP size (retire serve passes it)",
    ),
    Hook("vllm.config.parallel", "ParallelConfig.data_parallel_size", _F, use="dp: log path"),
    Hook(_ASYNC, "AsyncLLM.abort", _C, ("request_id", "internal"), "(e)"),
    Hook(_ASYNC, "AsyncLLM.add_request", _C, ("request_id", "prompt", "params"), "(e)"),
    Hook(_ASYNC, "AsyncLLM._run_output_handler", _C, (), "(e), serving: calls fail when it ends"),
    Hook(_ASYNC, "AsyncLLM.output_handler", _I, use="serving: calls fail when it ends"),
    Hook(
        "vllm.v1.engine.core_client",
        "MPClient.utility_results",
        _I,
        use="serving: calls still waiting when the engine core dies",
    ),
    Hook("vllm.v1.engine.exceptions", "EngineDeadError", _C, (), "serving: a dead engine core"),
    Hook(_ASYNC, "AsyncLLM.output_processor", _I, use="(e)"),
    Hook("vllm.sampling_params", "RequestOutputKind.DELTA", _M, use="(e) merging collector"),
    # --- the facade, its scheduler subclass and the checker (facade.py, scheduler.py, ...) ------
    Hook(
        _SCHED,
        "Scheduler.has_unfinished_requests",
        _C,
        (),
        "facade: attach only when idle; serving: an idle engine's core log made durable",
    ),
    Hook(_SCHED, "Scheduler.get_num_unfinished_requests", _C, (), "facade: has_unfinished"),
    Hook("vllm.config.model", "ModelConfig.max_model_len", _F, use="facade: prompt check"),
    Hook(_SCHED, "Scheduler.block_size", _I, use="checker: reference block digests"),
    Hook("vllm.v1.request", "Request.request_id", _I, use="scheduler: parked paused requests"),
    Hook("vllm.v1.request", "RequestStatus.RUNNING", _M, use="scheduler: re-park paused requests"),
    Hook(_CORE, "EngineCore.vllm_config", _I, use="facade: block size, TP, model, dtype"),
    Hook("vllm.config.cache", "CacheConfig.block_size", _F, use="facade: fingerprint"),
    Hook("vllm.config.parallel", "ParallelConfig.tensor_parallel_size", _F, use="rank receipts"),
    Hook("vllm.config.model", "ModelConfig.model", _F, use="facade: fingerprint"),
    Hook("vllm.config.model", "ModelConfig.dtype", _F, use="facade: fingerprint"),
    Hook("vllm.v1.engine", "EngineCoreOutput", _M, use="scheduler: terminal ABORT output"),
    Hook("vllm.v1.engine", "EngineCoreOutputs", _M, use="scheduler: output bucket"),
    Hook("vllm.inputs.llm", "TokensPrompt.prompt_token_ids", _F, use="facade: token prompts"),
    Hook("vllm.inputs.llm", "TokensPrompt.cache_salt", _F, use="facade: physical cache salt"),
    Hook("vllm.sampling_params", "SamplingParams.temperature", _F, use="greedy"),
    Hook("vllm.sampling_params", "SamplingParams.max_tokens", _F, use="version budget"),
    Hook("vllm.sampling_params", "SamplingParams.ignore_eos", _F, use="fixed-length outputs"),
    Hook("vllm.sampling_params", "SamplingParams.output_kind", _F, use="DELTA frames"),
    Hook("vllm.sampling_params", "RequestOutputKind.FINAL_ONLY", _M, use="checker references"),
    Hook("vllm.outputs", "RequestOutput.request_id", _I, use="facade: external id of a frame"),
    Hook("vllm.outputs", "RequestOutput.outputs", _I, use="facade: frame tokens"),
    Hook("vllm.outputs", "RequestOutput.finished", _I, use="facade: natural finish -> receipts"),
    Hook("vllm.outputs", "RequestOutput.num_cached_tokens", _I, use="vLLM's reported reuse"),
    Hook("vllm.outputs", "CompletionOutput.token_ids", _F, use="facade: frame tokens"),
    Hook("vllm.outputs", "CompletionOutput.finish_reason", _F, use="facade: abort vs length"),
    Hook("vllm.v1.engine.core_client", "InprocClient.shutdown", _C, (), "facade.shutdown"),
    Hook(_POOL, "BlockPool.num_gpu_blocks", _I, use="tests: every block free"),
    Hook(
        "vllm.v1.executor.uniproc_executor",
        "UniProcExecutor.collective_rpc",
        _C,
        ("method", "timeout", "args", "kwargs"),
        "digests/receipts with TP=1",
    ),
    Hook(
        "vllm.v1.worker.worker_base",
        "WorkerWrapperBase.__getattr__",
        _C,
        ("attr",),
        "collective_rpc callables get the wrapper; attributes forward to the worker",
    ),
    Hook("vllm.v1.worker.cpu_worker", "CPUWorker", _M, use="TP ranks on CPU"),
    # --- KV connector API (alternative pin/receipt route) --------------------------------------
    Hook(
        _KVC,
        "KVConnectorBase_V1.request_finished",
        _C,
        ("request", "block_ids"),
        "delay_free",
    ),
    Hook(
        _KVC,
        "KVConnectorBase_V1.get_finished",
        _C,
        ("finished_req_ids",),
        "per-rank receipts",
    ),
)


def _resolve(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _param_names(target: Any) -> list[str]:
    sig = inspect.signature(target)
    return [p for p in sig.parameters if p not in ("self", "cls")]


def _is_subsequence(wanted: Sequence[str], have: Sequence[str]) -> bool:
    it = iter(have)
    return all(any(w == h for h in it) for w in wanted)


def _class_fields(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in inspect.getmro(cls):
        for attr in (
            "__dataclass_fields__",
            "__struct_fields__",
            "model_fields",
            "__annotations__",
        ):
            value = klass.__dict__.get(attr)
            if isinstance(value, (dict, tuple, list)):
                names.update(str(n) for n in value)
    return names


def _assigns_instance_attr(cls: type, attr: str) -> bool:
    pattern = re.compile(rf"\bself\.{re.escape(attr)}\s*(?::[^=\n]+)?=(?!=)")
    for klass in inspect.getmro(cls):
        if klass is object:
            continue
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(src):
            return True
    return attr in _class_fields(cls)


def check_hook(hook: Hook) -> str | None:
    """Return a one-line problem description, or ``None`` if the hook is present and matches."""
    try:
        module = importlib.import_module(hook.module)
    except Exception as exc:  # ImportError and anything a broken import raises
        return f"{hook.name}: cannot import module ({type(exc).__name__}: {exc})"
    owner_path, _, leaf = hook.path.rpartition(".")
    try:
        if hook.kind in (Kind.FIELD, Kind.INSTANCE_ATTR):
            owner = _resolve(module, owner_path) if owner_path else module
            if not isinstance(owner, type):
                return f"{hook.name}: owner {owner_path!r} is not a class"
            if hook.kind is Kind.FIELD:
                if leaf not in _class_fields(owner) and not hasattr(owner, leaf):
                    return f"{hook.name}: missing field {leaf!r}"
            elif not _assigns_instance_attr(owner, leaf):
                return f"{hook.name}: no assignment to self.{leaf} in {owner.__qualname__}"
            return None
        target = _resolve(module, hook.path)
    except AttributeError:
        return f"{hook.name}: missing"
    if hook.kind is Kind.MEMBER:
        if hook.path == "__version__" and target != VLLM_VERSION:
            return f"{hook.name}: version {target!r} != pinned {VLLM_VERSION!r}"
        return None
    if not callable(target):
        return f"{hook.name}: not callable"
    try:
        have = _param_names(target)
    except (TypeError, ValueError) as exc:
        return f"{hook.name}: no signature ({exc})"
    if not _is_subsequence(hook.params, have):
        return f"{hook.name}: parameters {list(hook.params)} not found in order in {have}"
    return None


def check_hooks(hooks: Iterable[Hook] = HOOKS) -> list[str]:
    """All problems found in ``hooks`` (empty list: every hook present and matching)."""
    problems: list[str] = []
    for hook in hooks:
        problem = check_hook(hook)
        if problem is not None:
            problems.append(problem)
    return problems


if __name__ == "__main__":
    found = check_hooks()
    print("\n".join(found) if found else f"all {len(HOOKS)} hooks present (vllm {VLLM_VERSION})")
    raise SystemExit(1 if found else 0)
