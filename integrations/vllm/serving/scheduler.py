"""``RetireServingScheduler``: the scheduler class ``retire serve`` gives vLLM's engine core.

Loaded by qualified name (``--scheduler-cls retire_vllm.serving.scheduler.
RetireServingScheduler``) inside the engine-core process, it builds the ``EngineSide`` (the
version authority) and hands it the scheduler's observation points: a request added, the
schedule (pause, allocations, the write gate), the commit (the commit gate), the step's outputs
(writer closures, the engine-boundary gate, finished requests) and requests finished from
outside (vLLM's abort when a client goes away), and each preemption (inside the schedule, so
that the blocks the preempted version's pages held are free for the very allocation that
preempted it). With ``step_digests``' connector installed it
names to the workers, after the schedule, the blocks whose writers will close at the step's
commit (``EngineSide.blocks_to_digest``), and hands the digests they took back to the engine
side at the commit. Requests without a scope pass untouched. It
also times each step (schedule to the end of the commit) for ``EngineTime``, and at shutdown
makes the core log's last lines durable (when vLLM lets its shutdown get that far: the engine
side also makes them durable whenever the engine goes idle).
"""

from __future__ import annotations

import time
from typing import Any

from ..scheduler import RetireScheduler, commit_without
from . import step_digests, wire
from .engine_side import EngineSide


class RetireServingScheduler(RetireScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retire_side = EngineSide(self)
        self.retire_hooks = self.retire_side

    def add_request(self, request: Any) -> None:
        if self.retire_side.holds(request):  # until its version's Admit, or ended
            return
        super().add_request(request)
        self.retire_side.on_add_request(request)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        side = self.retire_side
        if not side.attached:
            return super(RetireScheduler, self).update_from_output(
                scheduler_output, model_runner_output
            )
        refused = side.before_commit(self, scheduler_output)
        outputs = commit_without(
            self,
            refused,
            lambda: super(RetireScheduler, self).update_from_output(
                scheduler_output, model_runner_output
            ),
            stop_reason=wire.STOP_MARK + wire.FINISH_SUPERSEDED,
        )
        side.after_commit(outputs, step_digests.digests_of(scheduler_output, model_runner_output))
        side.engine_time.step_committed(time.perf_counter())
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]:
        if request_ids is not None and not isinstance(request_ids, str):
            request_ids = list(request_ids)  # read twice
        finished: list[Any] = super().finish_requests(request_ids, finished_status)
        if self.retire_side.held:
            self.retire_side.drop_held(request_ids)
        if finished and self.retire_side.attached:
            self.retire_side.on_finished_outside(finished)
        return finished

    def shutdown(self) -> None:
        self.retire_side.shutdown()
        super().shutdown()

    def schedule(self, throttle_prefills: bool = False) -> Any:
        if not self.retire_side.attached:
            return super(RetireScheduler, self).schedule(throttle_prefills)
        side = self.retire_side
        with side.engine_time.scheduling():
            scheduler_output = super().schedule(throttle_prefills)
        step_digests.name_blocks(scheduler_output, side.blocks_to_digest())
        return scheduler_output
