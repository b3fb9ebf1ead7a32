"""The step digests' connector (``retire_vllm.serving.step_digests``) without a server: the worker
side digests the blocks the step named over the layers in the model runner's order, once per
step; the answers of several ranks aggregate in rank order and only for one step; the engine side
takes an answer only for the step it commits; ``retire serve`` installs the connector unless the
user configured one or speculative decoding. (``tests/vllm/serving/`` checks it on a real
server: the digests it delivers pass the byte check at adoption.)

The module (and with it vLLM's KV connector package) is imported when these tests run, not when
they are collected: imported into a test process before its first in-process engine is built,
it left that engine without vLLM's pipeline-parallel group (``tests/test_bench_vllm.py`` failed;
the cause inside vLLM was not found). ``retire serve`` imports it in the engine-core process,
whose workers are processes of their own."""

from __future__ import annotations

import json
import os
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import torch

from retire_vllm import kv_digest
from retire_vllm.serving.server import parse

if TYPE_CHECKING:
    from types import ModuleType

pytestmark = pytest.mark.vllm


@pytest.fixture
def sd() -> ModuleType:
    from retire_vllm.serving import step_digests

    return step_digests


def _worker(sd: ModuleType) -> Any:
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    config = types.SimpleNamespace(kv_transfer_config=KVTransferConfig(**sd.CONNECTOR_CONFIG))
    return sd.StepDigestConnector(config, KVConnectorRole.WORKER, None)


def _layer(seed: int) -> torch.Tensor:
    # the CPU backend's logical view: [blocks, heads, block size, 2 * head size]
    return torch.randn(8, 2, 4, 6, generator=torch.Generator().manual_seed(seed))


def test_the_worker_digests_the_named_blocks_over_the_layers_in_the_runners_order(
    sd: ModuleType,
) -> None:
    layers = [_layer(i) for i in range(3)]
    worker = _worker(sd)
    # registered out of order, as a dict may hold them; layer 10 sorts after layer 2
    worker.register_kv_caches(
        {
            "model.layers.10.self_attn.attn": layers[2],
            "model.layers.0.self_attn.attn": layers[0],
            "model.layers.2.self_attn.attn": layers[1],
        }
    )
    meta = sd.StepBlocks(step=7)
    sd.name_blocks(types.SimpleNamespace(kv_connector_metadata=meta), [1, 5])
    worker.bind_connector_metadata(meta)
    worker.wait_for_save()
    answer = worker.build_connector_worker_meta()
    assert isinstance(answer, sd.StepDigests) and answer.step == 7
    assert answer.per_rank == [kv_digest.block_digests(layers, [1, 5])]
    assert len(answer.seconds) == 1 and answer.seconds[0] > 0  # the worker timed its digests
    assert answer.per_rank != [kv_digest.block_digests(layers[::-1], [1, 5])]
    # one answer per step: the next step's meta without a forward has nothing to hand back
    assert worker.build_connector_worker_meta() is None


def test_ranks_aggregate_in_rank_order_and_only_within_one_step(sd: ModuleType) -> None:
    first, second = sd.StepDigests(3, [{1: "a"}], [0.5]), sd.StepDigests(3, [{1: "b"}], [0.75])
    merged = first.aggregate(second)
    assert isinstance(merged, sd.StepDigests) and merged.per_rank == [{1: "a"}, {1: "b"}]
    assert merged.seconds == [0.5, 0.75]  # each rank's time digesting, in rank order
    with pytest.raises(ValueError):
        first.aggregate(sd.StepDigests(4, [{1: "c"}], [0.1]))


def test_the_engine_side_takes_only_the_answer_of_the_step_it_commits(sd: ModuleType) -> None:
    meta = sd.StepBlocks(step=5)
    scheduled = types.SimpleNamespace(kv_connector_metadata=meta)

    def output(answer: object) -> object:
        return types.SimpleNamespace(
            kv_connector_output=types.SimpleNamespace(kv_connector_worker_meta=answer)
        )

    answer = sd.digests_of(scheduled, output(sd.StepDigests(5, [{2: "d"}], [0.25])))
    assert (answer.per_rank, answer.seconds) == ([{2: "d"}], [0.25])
    assert (
        sd.digests_of(scheduled, output(sd.StepDigests(4, [{2: "d"}], [0.1]))) is None
    )  # another step
    assert sd.digests_of(scheduled, output(None)) is None  # the workers did not digest
    assert sd.digests_of(types.SimpleNamespace(kv_connector_metadata=None), output(None)) is None
    plain = types.SimpleNamespace(kv_connector_metadata=None)
    sd.name_blocks(plain, [1])  # no connector: nothing to name
    assert plain.kv_connector_metadata is None


@pytest.fixture
def restored_environ() -> Iterator[None]:
    """``parse`` sets the serving process's environment (multiprocessing on, the CPU engine's
    settings): the in-process engines of later tests in this process must not inherit it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_inside_a_multiconnector_the_engine_side_finds_its_own_part(sd: ModuleType) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
        MultiKVConnectorMetadata,
        MultiKVConnectorWorkerMetadata,
    )

    theirs = types.SimpleNamespace(blocks=[])  # the user's connector's metadata comes first
    ours = sd.StepBlocks(step=5)
    scheduled = types.SimpleNamespace(
        kv_connector_metadata=MultiKVConnectorMetadata(metadata=(theirs, ours))
    )
    sd.name_blocks(scheduled, [4, 7])
    assert ours.blocks == [4, 7] and theirs.blocks == []
    answer = MultiKVConnectorWorkerMetadata(metadata=(None, sd.StepDigests(5, [{4: "a"}], [0.1])))
    output = types.SimpleNamespace(
        kv_connector_output=types.SimpleNamespace(kv_connector_worker_meta=answer)
    )
    assert sd.digests_of(scheduled, output).per_rank == [{4: "a"}]
    nothing = MultiKVConnectorWorkerMetadata(metadata=(None, None))
    output.kv_connector_output.kv_connector_worker_meta = nothing
    assert sd.digests_of(scheduled, output) is None


@pytest.mark.usefixtures("restored_environ")
def test_retire_serve_installs_the_connector_beside_the_users_and_not_with_drafts(
    sd: ModuleType,
) -> None:
    installed = parse([]).kv_transfer_config
    assert installed is not None and installed.kv_connector == "StepDigestConnector"
    own = '{"kv_connector": "ExampleConnector", "kv_role": "kv_both", "engine_id": "e1"}'
    both = parse(["--kv-transfer-config", own]).kv_transfer_config
    assert (both.kv_connector, both.kv_role, both.engine_id) == ("MultiConnector", "kv_both", "e1")
    assert both.kv_connector_module_path == sd.__name__  # Retire's MultiConnector: see its tests
    theirs, ours = both.kv_connector_extra_config["connectors"]
    assert (theirs["kv_connector"], theirs["kv_role"]) == ("ExampleConnector", "kv_both")
    assert "engine_id" not in theirs  # the MultiConnector passes its own to each child
    assert ours == sd.CONNECTOR_CONFIG
    assert sd.with_step_digests(both) is both  # installed once
    multi = json.dumps(
        {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [theirs, theirs]},
        }
    )
    appended = parse(["--kv-transfer-config", multi]).kv_transfer_config
    assert appended.kv_connector_extra_config["connectors"] == [theirs, theirs, ours]
    assert appended.kv_connector_module_path == sd.__name__
    custom = json.dumps({**json.loads(multi), "kv_connector_module_path": "theirs.multi"})
    kept = sd.with_step_digests(parse(["--kv-transfer-config", custom]).kv_transfer_config)
    assert kept.kv_connector_module_path == "theirs.multi"  # a class of their own is kept
    drafts = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}'
    assert parse(["--speculative-config", drafts]).kv_transfer_config is None
    assert parse(["--retire-step-digests", "off"]).kv_transfer_config is None
    assert parse(["--retire-step-digests", "on"]).kv_transfer_config.kv_connector == (
        "StepDigestConnector"
    )
    with pytest.raises(SystemExit):
        parse(["--retire-step-digests", "sometimes"])


@pytest.mark.usefixtures("restored_environ")
def test_retire_serve_keeps_the_cpu_cores_vllm_reserves_without_a_connector(
    sd: ModuleType,
) -> None:
    from vllm import envs
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    # A process that built an engine reads vLLM's settings once (its envs cache); the engine
    # core that ``retire serve`` starts reads this one at start-up, before any cache.
    cached = envs._is_envs_cache_enabled()
    envs.disable_envs_cache()
    try:
        _reservations(sd, OMPProcessManager)
    finally:
        if cached:
            envs.enable_envs_cache()


def _reservations(sd: ModuleType, manager: Any) -> None:
    def reserved(kv_transfer_config: object) -> int:
        parallel = types.SimpleNamespace(
            local_world_size=1, data_parallel_rank_local=None, _api_process_count=1
        )
        config = types.SimpleNamespace(
            parallel_config=parallel, kv_transfer_config=kv_transfer_config
        )
        return int(manager(config).reserve_cpu_num)

    os.environ.pop(sd.RESERVED_CPU_ENV, None)
    without = reserved(None)
    connector = parse([]).kv_transfer_config
    assert os.environ.pop(sd.RESERVED_CPU_ENV) == str(without)
    # what it makes up for: vLLM reserves a core more for any connector, this one too
    assert reserved(connector) == without + 1
    os.environ[sd.RESERVED_CPU_ENV] = str(without)
    assert reserved(connector) == without
    os.environ[sd.RESERVED_CPU_ENV] = "0"  # the user's reservation is kept
    parse([])
    assert os.environ.pop(sd.RESERVED_CPU_ENV) == "0"
    own = '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}'
    parse(["--kv-transfer-config", own])  # a connector of the user's: vLLM's reservation
    assert sd.RESERVED_CPU_ENV not in os.environ
    parse(["--retire-step-digests", "off"])  # no connector: nothing to make up for
    assert sd.RESERVED_CPU_ENV not in os.environ
