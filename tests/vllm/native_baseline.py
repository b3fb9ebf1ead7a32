"""Native abort-and-resubmit on the same in-process vLLM engine (the baseline of the vLLM tests).

``NativeEngine`` implements ``retire_vllm.api.ReplacementEngine`` with vLLM's public calls only:
``supersede`` aborts the old request (``LLMEngine.abort_request(internal=True)``) and submits the
revised prompt as a new request under the same ``cache_salt`` (so vLLM may reuse whatever prefix
is still cached: opportunistic reuse).  Every ``RequestOutput`` goes to the scope's consumer
queue as it arrives, stamped with the version that produced it; ``consume`` hands over whatever
is queued: there is no version gate anywhere, exactly like a client reading vLLM's output
collector after an abort.  The engine must be idle and have no Retire facade attached.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from retire_core import Contract
from retire_vllm import introspect as ix
from retire_vllm.api import Delivery


class NativeEngine:
    def __init__(self, engine: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        sched = ix.scheduler(engine)
        if getattr(sched, "retire_hooks", None) is not None or sched.has_unfinished_requests():
            raise RuntimeError("the native baseline needs an idle engine with no facade attached")
        self.engine = engine
        self.clock = clock
        self.pool = ix.block_pool(engine)
        self.initial_free_blocks = self.pool.get_num_free_blocks()
        self.version: dict[str, int] = {}
        self.request: dict[str, str] = {}  # scope -> internal id of the current request
        self.owner: dict[str, tuple[str, int]] = {}  # external id -> (scope, version)
        self.queues: dict[str, deque[Delivery]] = {}
        self.num_cached_tokens: dict[tuple[str, int], int] = {}
        self.token_ids: dict[tuple[str, int], list[int]] = {}

    def _add(self, scope: str, prompt: Sequence[int], max_tokens: int) -> None:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        version = self.version[scope]
        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        external = f"native-{scope}@{version}"
        rid = self.engine.add_request(
            external, {"prompt_token_ids": list(prompt), "cache_salt": f"native:{scope}"}, params
        )
        self.request[scope] = rid
        self.owner[external] = (scope, version)
        self.token_ids[(scope, version)] = []

    def submit(self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int) -> int:
        self.version[scope] = 0
        self.queues[scope] = deque()
        self._add(scope, prompt, max_tokens)
        return 0

    def supersede(
        self, scope: str, prompt: Sequence[int], contract: Contract, max_tokens: int
    ) -> int:
        self.engine.abort_request([self.request[scope]], internal=True)
        self.version[scope] += 1
        self._add(scope, prompt, max_tokens)
        return self.version[scope]

    def pause(self, scope: str) -> None:
        raise NotImplementedError("vLLM has no per-request pause")

    def unpause(self, scope: str) -> None:
        raise NotImplementedError("vLLM has no per-request pause")

    def cancel(self, scope: str) -> None:
        self.engine.abort_request([self.request[scope]], internal=True)

    def step(self) -> None:
        for out in self.engine.step():
            scope, version = self.owner[out.request_id]
            tokens = tuple(out.outputs[0].token_ids)
            self.token_ids[(scope, version)].extend(tokens)
            if out.num_cached_tokens is not None:
                self.num_cached_tokens.setdefault((scope, version), int(out.num_cached_tokens))
            if tokens or out.finished:
                self.queues[scope].append(
                    Delivery(scope, version, tokens, bool(out.finished), self.clock())
                )

    def consume(self, scope: str) -> list[Delivery]:
        queue = self.queues[scope]
        out = list(queue)
        queue.clear()
        return out

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def close(self) -> None:
        for scope in self.request:
            self.engine.abort_request([self.request[scope]], internal=True)
        while self.engine.has_unfinished_requests():
            self.engine.step()
        free = self.pool.get_num_free_blocks()
        if free != self.initial_free_blocks:
            raise RuntimeError(f"native run left {self.initial_free_blocks - free} blocks in use")
