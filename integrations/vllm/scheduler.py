"""``RetireScheduler``: vLLM's scheduler with Retire's two step-level hook points.

Built with ``scheduler_cls=RetireScheduler`` (``EngineArgs``); with no facade attached
(``retire_hooks is None``) it behaves exactly like ``vllm.v1.core.sched.scheduler.Scheduler``.
A facade attaches itself as ``retire_hooks`` and then gets:

* ``withheld(scheduler) -> set[str]``: request ids that must not be scheduled in this step
  (paused scopes); they are taken out of ``running`` around ``Scheduler.schedule`` and put back
  in their places afterwards (vLLM keeps an unscheduled request's cached state), and out of the
  waiting queues (``waiting``, ``kv_holding_waiting``: a request of a paused version that has
  not run yet, or was preempted), back at their fronts afterwards.
* ``after_schedule(scheduler, scheduler_output)``: called once the step is scheduled and blocks
  are allocated, *before* the model executes: the facade reports allocations and the writes this
  step will make (the write gate), and it is the point where revisions that arrive while a step
  runs land (the step's KV writes then happen after ADVANCE: "late steps").
* ``before_commit(scheduler, scheduler_output) -> set[str]``: the commit gate.  Called before
  ``Scheduler.update_from_output`` commits the step; the facade asks the core about a ``COMMIT``
  frame for every scheduled request it manages and returns the ids whose commit was dropped.
  Those requests are finished (``FINISHED_ABORTED``) *before* the base class commits, so their
  sampled tokens are never appended (the base loop skips finished requests), and a terminal
  ``finish_reason=ABORT`` output is added for each, so the front end closes them too (research
  item (f): without it ``LLMEngine.has_unfinished_requests()`` never turns false).
* ``on_preempted(request)``: called from ``Scheduler._preempt_request`` once vLLM dropped a
  request's blocks to make room for an allocation, still inside the schedule, so that the
  blocks Retire kept for the request's pages can serve that very allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import RequestStatus


class SchedulerHooks(Protocol):
    def withheld(self, scheduler: RetireScheduler) -> set[str]: ...

    def after_schedule(self, scheduler: RetireScheduler, scheduler_output: Any) -> None: ...

    def before_commit(self, scheduler: RetireScheduler, scheduler_output: Any) -> set[str]: ...

    def on_preempted(self, request: Any) -> None: ...


class RetireScheduler(Scheduler):
    retire_hooks: SchedulerHooks | None = None

    def schedule(self, throttle_prefills: bool = False) -> Any:
        hooks = self.retire_hooks
        if hooks is None:
            return super().schedule(throttle_prefills)
        held = hooks.withheld(self)
        parked: list[tuple[int, Any]] = []
        waiting: list[tuple[Any, list[Any]]] = []
        if held:
            parked = [(i, r) for i, r in enumerate(self.running) if r.request_id in held]
            if parked:
                self.running = [r for r in self.running if r.request_id not in held]
            for queue in (self.waiting, self.kv_holding_waiting):
                mine = [r for r in queue if r.request_id in held]
                if mine:
                    queue.remove_requests(mine)
                    waiting.append((queue, mine))
        try:
            out = super().schedule(throttle_prefills)
        finally:
            for i, r in parked:  # back in place; preempted ones stay in waiting
                if r.status == RequestStatus.RUNNING and r not in self.running:
                    self.running.insert(min(i, len(self.running)), r)
            for queue, mine in waiting:  # back at the front, in their order
                queue.prepend_requests(reversed(mine))
        hooks.after_schedule(self, out)
        return out

    def _preempt_request(
        self, request: Any, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        super()._preempt_request(request, timestamp, drop_stale_output)  # vLLM dropped its blocks
        if self.retire_hooks is not None:
            self.retire_hooks.on_preempted(request)  # ... and Retire its pages, at once

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        hooks = self.retire_hooks
        if hooks is None:
            return super().update_from_output(scheduler_output, model_runner_output)
        refused = hooks.before_commit(self, scheduler_output)
        return commit_without(
            self,
            refused,
            lambda: super(RetireScheduler, self).update_from_output(
                scheduler_output, model_runner_output
            ),
        )


def commit_without(
    scheduler: Scheduler,
    refused: Iterable[str],
    commit: Callable[[], Any],
    stop_reason: str | None = None,
) -> Any:
    """Run ``commit`` (the base ``update_from_output``) so that the ``refused`` requests commit
    nothing: they are finished as aborted first (the base loop skips finished requests) and each
    gets the terminal ABORT output the engine's drain loop waits for (without it, it hangs),
    carrying ``stop_reason``."""
    live = sorted(rid for rid in refused if rid in scheduler.requests)
    closed = scheduler.finish_requests(live, RequestStatus.FINISHED_ABORTED) if live else []
    outputs = commit()
    for req in closed:
        eco = outputs.setdefault(req.client_index, EngineCoreOutputs())
        eco.outputs.append(
            EngineCoreOutput(
                request_id=req.request_id,
                new_token_ids=[],
                finish_reason=FinishReason.ABORT,
                stop_reason=stop_reason,
            )
        )
    return outputs
