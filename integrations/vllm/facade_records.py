"""What the in-process engine (``facade.RetireEngine``) records: per version, per scope, per
request outside Retire, and its statistics; and its internal bookkeeping of the requests it manages
and the chunks queued for consumers. Plain records only: nothing here observes vLLM or decides.
"""

from __future__ import annotations

from typing import Any

import attrs

from retire_core import Contract

from .identity import OutputNames
from .observe import BlockTables

# --- what each version did ------------------------------------------------------------


@attrs.define
class VersionRecord:
    """Everything one version of a scope did, as observed by the facade."""

    scope: str
    version: int
    prompt: tuple[int, ...]
    max_tokens: int
    contract: Contract
    context: tuple[str, ...]
    submitted_at: float
    salt: str | None = None  # the physical cache_salt its request ran under
    request_id: str | None = None
    participants: tuple[str, ...] = ()
    admitted: bool = False
    admitted_at: float | None = None
    cold: bool | None = None
    adopted_blocks: int = 0
    adopted_pages: tuple[int, ...] = ()
    # (page, position, generation, digest, KV cache group) of each certified page
    certificate: tuple[tuple[int, int, int, str, int], ...] = ()
    adoption_report: dict[int, str] = attrs.field(factory=dict)  # page -> digest read
    released: list[tuple[int, str]] = attrs.field(factory=list)  # (page, reason)
    # vLLM's prefix hit at first schedule, one block table per KV cache group
    hit_block_ids: tuple[tuple[int, ...], ...] | None = None
    num_cached_tokens: int | None = None  # as reported by vLLM's RequestOutput
    output_token_ids: list[int] = attrs.field(factory=list)  # everything vLLM generated
    delivered_token_ids: list[int] = attrs.field(factory=list)  # what the consumer got
    dropped_engine_tokens: int = 0  # dropped at the engine boundary
    dropped_consumer_tokens: int = 0  # dropped at the consumer boundary (sat in the queue)
    commits: int = 0
    commits_dropped: int = 0
    writes: int = 0
    pages: list[int] = attrs.field(factory=list)  # block ids allocated for this version
    receipts: dict[str, float] = attrs.field(factory=dict)  # participant -> time
    rank_receipts: list[dict[str, Any]] = attrs.field(factory=list)
    finish_reason: str | None = None
    fenced: bool = False
    first_output_at: float | None = None
    first_delivery_at: float | None = None
    last_delivery_at: float | None = None
    finished_at: float | None = None
    closed_at: float | None = None
    # names the blocks past its context (``identity.OutputNames``), until its admission takes them
    output_names: OutputNames | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def closed(self) -> bool:
        return bool(self.participants) and all(p in self.receipts for p in self.participants)


@attrs.define
class ScopeLog:
    scope: str
    tenant: str
    versions: list[VersionRecord] = attrs.field(factory=list)

    @property
    def current(self) -> VersionRecord:
        return self.versions[-1]

    def version(self, v: int) -> VersionRecord:
        return self.versions[v]


@attrs.define
class ExternalRequest:
    """A request that is not under Retire (a co-tenant, or a native baseline's request)."""

    request_id: str
    prompt: tuple[int, ...]
    salt: str | None
    token_ids: list[int] = attrs.field(factory=list)
    num_cached_tokens: int | None = None
    finished: bool = False
    finish_reason: str | None = None


@attrs.define
class Stats:
    frames_published: int = 0
    frames_dropped: int = 0
    commits_dropped: int = 0
    writes_allowed: int = 0
    fences: int = 0
    fences_deferred: int = 0
    pins: int = 0
    adopted_pages: int = 0
    released_pages: int = 0
    uncertified_hashes_evicted: int = 0
    pages_reused: int = 0
    cached_pages_evicted: int = 0
    window_pages_passed: int = 0  # pages a sliding window passed (``PageUnreferenced``)
    preemptions: int = 0


# --- internal bookkeeping ----------------------------------------------------------------------


@attrs.define
class FacadeRequest:
    rid: str
    scope: str
    version: int
    participants: tuple[str, ...]
    salt: str
    record: VersionRecord  # records[scope].version(version): a scope's log is never replaced
    adopted: tuple[tuple[int, ...], ...] = ()  # one block table per KV cache group
    tables: BlockTables = attrs.field(factory=BlockTables)  # vLLM's, one per KV cache group
    pages: list[int] = attrs.field(factory=list)
    handoff_pins: list[int] = attrs.field(factory=list)
    scheduled: bool = False
    finished: bool = False
    closed: set[str] = attrs.field(factory=set)
    names: OutputNames | None = None  # names the blocks past its context (``identity``)
    request: Any = None  # vLLM's ``Request``, until its writers closed (``executor.block_name``)
    # how many times vLLM preempted it: each time it runs again under new participants
    preemptions: int = 0


@attrs.define
class Chunk:
    scope: str
    version: int
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
