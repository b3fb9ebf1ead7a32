"""What crosses the process boundary between the API process and the engine-core process.

The names of the request arguments that put a request under a scope, the one utility method and
its operations, the marker a fence's terminal output carries, the finish reasons a client sees,
how a refusal travels back (an error dict, never an exception) and becomes an HTTP error in
OpenAI's format, and with data parallelism which engine a scope lives on (``affinity``) and how
the answers of every engine to a call without a scope combine (``merge_answers``), and the
``Server-Timing`` a scoped response carries (``server_timing``). Nothing here
decides protocol: errors are the core's typed errors, classified by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from retire_core.reasons import DropReason

#: ``vllm_xargs`` keys a client sends (``extra_body={"vllm_xargs": {...}}``).
XARG_SCOPE = "retire_scope"
XARG_TENANT = "retire_tenant"
#: Set by the API process on a scoped request: the ``open`` it follows (never by a client).
XARG_OPENING = "retire_opening"
#: Set by the engine side once the authority admitted the request's version, in place of
#: ``XARG_OPENING`` (never by a client).
XARG_VERSION = "retire_version"


def _extra_args(request: Any) -> dict[str, Any] | None:
    params = getattr(request, "sampling_params", None)  # None: a pooling request
    return params.extra_args if params is not None else None


def admitted_version(request: Any) -> tuple[str, int] | None:
    """The (scope, version) a vLLM request runs as, if the engine side stamped it with an
    admitted version (a scoped request); ``None`` for any other request."""
    args = _extra_args(request)
    if not args or XARG_VERSION not in args:
        return None
    return str(args[XARG_SCOPE]), int(args[XARG_VERSION])


def opening_of(request: Any) -> str | None:
    """The ``open`` a scoped request follows, until the engine side stamps it
    (``stamp_version``); ``None`` for any other request."""
    args = _extra_args(request)
    return None if not args else args.get(XARG_OPENING)


def stamp_version(request: Any, version: int) -> None:
    """The request runs as ``version`` of its scope: it follows no ``open`` any more."""
    args = _extra_args(request)
    assert args is not None, "only a scoped request is stamped"
    args.pop(XARG_OPENING, None)
    args[XARG_VERSION] = version


#: Headers that do the same as the two ``vllm_xargs`` keys.
HEADER_SCOPE = "x-retire-scope"
HEADER_TENANT = "x-retire-tenant"
DEFAULT_TENANT = "default"
#: Response header of a scoped request: the version it runs as (sent once it is admitted).
HEADER_VERSION = "x-retire-version"
HEADER_INCARNATION = "x-retire-incarnation"

#: The ``EngineCore`` utility method the plugin installs, and its operations.
UTILITY = "retire_call"
OPS = (
    "attach",
    "open",
    "pause",
    "unpause",
    "cancel",
    "status",
    "abandon",
    "expire",
    "metrics",
    "leaks",
    "release_all",
)

#: A fence's terminal output carries ``stop_reason = STOP_MARK + finish reason``.
STOP_MARK = "retire:"
FINISH_SUPERSEDED = "superseded"
FINISH_CANCELLED = "cancelled"


def finish_reason(revoked: DropReason | None) -> str:
    """The finish reason that ends a request of a version the core no longer lets run
    (``Retire.revocation``): ``cancelled`` for a cancelled scope, ``superseded`` otherwise."""
    return FINISH_CANCELLED if revoked is DropReason.SCOPE_CANCELLED else FINISH_SUPERSEDED


#: HTTP status and OpenAI error ``code`` for each refusal (by the core error's class name).
_STATUS: dict[str, tuple[int, str]] = {
    "MalformedIdError": (400, "invalid_scope_request"),
    "ContractError": (400, "contract_not_inheritable"),
    "UnknownScopeError": (404, "scope_not_found"),
    "TenantMismatchError": (403, "scope_of_another_tenant"),
    "ScopeCancelledError": (409, "scope_cancelled"),
    "IllegalTransitionError": (409, "illegal_scope_transition"),
    "ScopeExistsError": (409, "scope_exists"),
}


class ScopeRequestError(ValueError):
    """A scope request the authority refused; nothing changed in the core or the engine."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.status, self.code = _STATUS.get(kind, (400, "invalid_scope_request"))

    def body(self) -> dict[str, Any]:
        """OpenAI's error format."""
        return {"error": {"message": str(self), "type": self.kind, "code": self.code}}


def refusal(err: Exception) -> dict[str, Any]:
    """The answer the engine side sends for a refused operation."""
    return {"ok": False, "error": type(err).__name__, "message": str(err)}


def raise_if_refused(answer: dict[str, Any]) -> dict[str, Any]:
    if not answer.get("ok", False):
        raise ScopeRequestError(str(answer.get("error")), str(answer.get("message")))
    return answer


def fence_reason(stop_reason: object) -> str | None:
    """The finish reason a fence's terminal output stands for, or None for any other output."""
    if isinstance(stop_reason, str) and stop_reason.startswith(STOP_MARK):
        return stop_reason[len(STOP_MARK) :]
    return None


def affinity(tenant: str, scope: str, engines: int) -> int:
    """The data-parallel engine a scope lives on: every version of it runs there and its
    authority is that engine's core. A stable hash of (tenant, scope), the same in every process
    and run (Python's ``hash`` of a string is not)."""
    digest = hashlib.blake2b(f"{tenant}\0{scope}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % engines


def merge_answers(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One answer from every engine's answer to a call without a scope (``attach``, ``expire``,
    ``metrics``, ``leaks``, ``release_all``): numbers add up, lists and mappings join, ``ok``
    holds if it holds everywhere; a histogram's ``bounds`` are the same everywhere and its
    ``counts`` add up bucket by bucket."""
    merged: dict[str, Any] = {}
    for answer in answers:
        for key, value in answer.items():
            if key not in merged:
                merged[key] = value
            else:
                merged[key] = _merge(key, merged[key], value)
    return merged


def _merge(key: str, a: Any, b: Any) -> Any:
    if isinstance(a, bool):
        return a and b
    if isinstance(a, int | float):
        return a + b
    if isinstance(a, dict):
        return {
            k: _merge(k, a[k], b[k]) if k in a and k in b else a.get(k, b.get(k))
            for k in {**a, **b}
        }
    if isinstance(a, list):
        if key == "bounds":
            return a
        if key == "counts":
            return [x + y for x, y in zip(a, b, strict=True)]
        return a + b
    return a


#: A scoped response's ``Server-Timing`` metrics: (name, from moment, to moment, what it covers);
#: ``retire-fence`` (a revision of a running version only) is the first part of ``retire-commands``.
#: The engine core's moments are its wall clock, comparable on one host. No comma in a
#: description: a header value's metrics are separated by commas.
SERVER_TIMING_PHASES = (
    ("retire-api", "arrived", "sent", "API process before the authority is asked"),
    ("retire-queue", "sent", "received", "to the engine core behind the step in flight"),
    ("retire-authority", "received", "decided", "block identities and the core's decision"),
    ("retire-fence", "decided", "fenced", "the fenced version's terminal output queued"),
    ("retire-commands", "decided", "carried_out", "the commands carried out: fences and pins"),
    ("retire-admission", "carried_out", "answered", "admission and the reply back"),
)

SERVER_TIMING_NAMES = tuple(name for name, *_ in SERVER_TIMING_PHASES)

#: The phases a superseded stream's close goes through in the server, one after the other (the
#: rest of it is the revision's way in over HTTP and the terminal output's way out to the client);
#: the fenced version's terminal output leaves while the revision's other commands are carried out.
CLOSE_PHASES = ("retire-api", "retire-queue", "retire-authority", "retire-fence")


def server_timing(moments: Mapping[str, float]) -> str:
    """The ``Server-Timing`` header value (W3C) for a request opened at these moments: one metric
    per phase whose two ends are known, in milliseconds."""
    return ", ".join(
        f'{name};dur={1000 * (moments[end] - moments[start]):.3f};desc="{what}"'
        for name, start, end, what in SERVER_TIMING_PHASES
        if start in moments and end in moments
    )
