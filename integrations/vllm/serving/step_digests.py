"""``StepDigestConnector``: the digests of the blocks a step fills, computed by the workers within
that step and carried back with its output.

A KV connector of vLLM's v1 connector API (installed by ``retire serve`` through
``--kv-transfer-config``, ``kv_connector_module_path`` naming this module) that moves no KV
and finds no external prefix: it only rides the connector's two per-step channels. On the way
down, the step's ``StepBlocks`` (which the engine side fills after the schedule: the blocks this
step's writes complete) goes with the scheduler's output to every worker; there, after the forward
pass (``wait_for_save``: every layer has written this step's KV), the worker digests those blocks
as ``introspect.worker_block_digests`` would, and its ``StepDigests`` come back with the model's
output, one table per rank in rank order. The engine side closes those writers with them at the
commit (``digests_of``), instead of a ``collective_rpc`` round trip to the workers after the
step. With a connector of the user's it runs beside theirs in this module's ``MultiConnector``
(``with_step_digests``; vLLM's, except that scoped requests load no external KV), and the engine
side finds its own part of the step's metadata there. A step whose digests did not come back
(speculative decoding defers ``wait_for_save`` past the meta) falls back to the round trip, as
does everything else that reads blocks (a finishing request's partial blocks, the byte check
before an adoption, TP receipts). Installed alone, it keeps the CPU cores vLLM reserves with no
connector (``keep_cpu_reservation``). No protocol is decided here: a digest is an observation,
the core decides.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, TypeVar

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector as VllmMultiConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiKVConnectorMetadata,
    MultiKVConnectorWorkerMetadata,
)

from .. import kv_digest
from . import wire

if TYPE_CHECKING:
    import torch

#: What ``retire serve`` puts in ``--kv-transfer-config`` when it installs this connector.
CONNECTOR_CONFIG: dict[str, Any] = {
    "kv_connector": "StepDigestConnector",
    "kv_connector_module_path": "retire_vllm.serving.step_digests",
    # a producer is the role that changes least here (a consumer changes multimodal input
    # checks); ``requires_kv_delivery`` below undoes what producing would change on preemption
    "kv_role": "kv_producer",
}


MULTI = "MultiConnector"
#: vLLM's knob for how many cores its CPU backend keeps apart from the workers' OpenMP threads.
RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def keep_cpu_reservation(local_world_size: int) -> None:
    """With this connector alone, reserve the cores vLLM's CPU backend reserves with no connector.

    vLLM reserves one more core per worker whenever any KV connector is configured (its
    ``OMPProcessManager``: room for a connector that moves KV beside the forward pass, as NIXL's
    does). This one moves nothing, and on a 2-core machine the extra reservation left the worker
    two OpenMP threads on one core, spinning at every barrier: the same load took 1.5-4x as long
    on the tiny model and 1.8x on the small one, stock vLLM with this connector as well (results
    4.8). A reservation the user set is kept, as is vLLM's with a connector of the user's (the
    caller installs this one beside it without calling this). Not on a GPU platform, which
    reserves nothing."""
    from vllm.platforms import CpuArchEnum, current_platform

    if RESERVED_CPU_ENV in os.environ or not current_platform.is_cpu():
        return
    per_worker = (CpuArchEnum.X86, CpuArchEnum.ARM, CpuArchEnum.RISCV)
    arch = current_platform.get_cpu_architecture()
    os.environ[RESERVED_CPU_ENV] = str(local_world_size if arch in per_worker else 1)


def with_step_digests(config: KVTransferConfig | None) -> KVTransferConfig:
    """The KV transfer configuration that installs this connector: alone when the user named
    none; beside the user's connector through this module's ``MultiConnector`` (theirs first,
    with their role: the engine behaves as they configured it, and this connector, which finds
    no prefix and moves no KV, only adds the digests); appended to a ``MultiConnector`` of
    theirs (which becomes this module's unless they named a class of their own)."""
    if config is None or config.kv_connector is None:
        return KVTransferConfig(**CONNECTOR_CONFIG)
    if config.has_connector(CONNECTOR_CONFIG["kv_connector"]):
        return config
    extra = dict(config.kv_connector_extra_config)
    if config.kv_connector == MULTI:
        extra["connectors"] = [*extra.get("connectors", []), CONNECTOR_CONFIG]
    else:
        theirs = {
            f.name: getattr(config, f.name)
            for f in dataclasses.fields(config)
            if f.name != "engine_id"  # the MultiConnector passes its own to each child
        }
        extra = {"connectors": [theirs, CONNECTOR_CONFIG]}
    their_class = config.kv_connector == MULTI and config.kv_connector_module_path
    module = config.kv_connector_module_path if their_class else __name__
    return dataclasses.replace(
        config, kv_connector=MULTI, kv_connector_module_path=module, kv_connector_extra_config=extra
    )


class MultiConnector(VllmMultiConnector):
    """vLLM's ``MultiConnector``, except that a scoped request finds no external KV: a scoped
    version's KV comes only from its own steps and the certified handoff, so a user's connector
    that would load KV into it (vLLM's ``ExampleConnector`` loads whatever it saved for the same
    tokens, whatever the cache salt) is not asked; every other request is served by the user's
    connectors as configured. Named as vLLM's class (and loaded through
    ``kv_connector_module_path``) because vLLM recognises a ``MultiConnector`` by that name."""

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if wire.admitted_version(request) is not None:
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)


_M = TypeVar("_M")


def _ours(meta: Any, kind: type[_M]) -> _M | None:
    """This connector's part of a step's metadata: the metadata itself, or its child in a
    ``MultiConnector``'s (one per child connector, in their order)."""
    if isinstance(meta, kind):
        return meta
    if isinstance(meta, MultiKVConnectorMetadata | MultiKVConnectorWorkerMetadata):
        for child in meta.metadata:
            if isinstance(child, kind):
                return child
    return None


class StepBlocks(KVConnectorMetadata):
    """Scheduler -> workers, one per step: which blocks to digest after the forward pass, and
    the step's number (the answer must name it)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.blocks: list[int] = []


class StepDigests(KVConnectorWorkerMetadata):
    """Workers -> scheduler, one per step: the digests of the step's ``StepBlocks``, one table per
    rank in rank order (vLLM aggregates the ranks' answers in that order), and the seconds each
    rank spent digesting them (inside the step: Retire's part of the forward pass's time)."""

    def __init__(self, step: int, per_rank: list[dict[int, str]], seconds: list[float]) -> None:
        self.step = step
        self.per_rank = per_rank
        self.seconds = seconds

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, StepDigests) or other.step != self.step:
            raise ValueError("step digests of different steps cannot be aggregated")
        return StepDigests(
            self.step, [*self.per_rank, *other.per_rank], [*self.seconds, *other.seconds]
        )


def name_blocks(scheduler_output: Any, blocks: list[int]) -> None:
    """Name the blocks the workers are to digest within this step (if the step carries
    ``StepBlocks``: the connector is installed)."""
    meta = _ours(getattr(scheduler_output, "kv_connector_metadata", None), StepBlocks)
    if meta is not None:
        meta.blocks = blocks


def digests_of(scheduler_output: Any, model_runner_output: Any) -> StepDigests | None:
    """The workers' answer that came back with this step's output for its ``StepBlocks``, or
    ``None`` if none did (no connector, or a step whose workers did not digest)."""
    meta = _ours(getattr(scheduler_output, "kv_connector_metadata", None), StepBlocks)
    connector_output = getattr(model_runner_output, "kv_connector_output", None)
    answer = _ours(getattr(connector_output, "kv_connector_worker_meta", None), StepDigests)
    if meta is not None and answer is not None and answer.step == meta.step:
        return answer
    return None


class StepDigestConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._steps = 0
        self._caches: list[torch.Tensor] = []
        self._answer: StepDigests | None = None

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # it hands no KV off: a preempted request simply runs again

    # ---- scheduler side ---------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False  # no external prefix: vLLM's own prefix cache answers alone

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self._steps += 1
        return StepBlocks(self._steps)  # its blocks are named once the schedule is complete

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        return False, None

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, None]:
        return False, None

    # ---- worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """The layers in the order of the model runner's ``kv_caches`` (vLLM's
        ``bind_kv_cache``: by layer index, then by name order within one index), which is the
        order ``introspect.worker_block_digests`` digests them in."""
        from vllm.model_executor.models.utils import extract_layer_index

        by_index: dict[int, list[str]] = defaultdict(list)
        for name in kv_caches:
            by_index[extract_layer_index(name)].append(name)
        self._caches = [kv_caches[n] for i in sorted(by_index) for n in by_index[i]]

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        """After the step's forward pass: digest the blocks it named."""
        meta = self._get_connector_metadata()
        if not isinstance(meta, StepBlocks):
            return
        began = time.perf_counter()
        digests = kv_digest.block_digests(self._caches, meta.blocks) if meta.blocks else {}
        self._answer = StepDigests(meta.step, [digests], [time.perf_counter() - began])

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        answer, self._answer = self._answer, None
        return answer
