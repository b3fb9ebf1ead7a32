"""Identifier types and their validation.

Scopes, tenants and participants are named by short strings; pages (KV blocks) and frames by
non-negative integers; versions by non-negative integers; block prefix identities (the chained
block hashes of a context) by ints, strings or bytes. Validation happens once, at the edge, in
``check_*`` helpers that raise ``MalformedIdError``; nothing here holds state.
"""

from __future__ import annotations

import re

from retire_core.errors import MalformedIdError

ScopeId = str
TenantId = str
ParticipantId = str
PageId = int
FrameId = int
Version = int
BlockKey = int | str | bytes

_NAME = re.compile(r"[A-Za-z0-9_.:/@#+-]{1,128}")  # whole string: fullmatch, not match with $


# Names already accepted (events name the same few scopes and participants over and over).
_ACCEPTED: set[str] = set()
_ACCEPTED_MAX = 1 << 16


def check_name(value: object, what: str) -> str:
    if type(value) is str and value in _ACCEPTED:
        return value
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise MalformedIdError(
            f"{what} must be 1-128 characters of [A-Za-z0-9_.:/@#+-], got {value!r}"
        )
    if type(value) is str:
        if len(_ACCEPTED) >= _ACCEPTED_MAX:
            _ACCEPTED.clear()
        _ACCEPTED.add(value)
    return value


def check_number(value: object, what: str) -> int:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedIdError(f"{what} must be a non-negative int, got {value!r}")
    return value


def check_block_key(key: object) -> BlockKey:
    if isinstance(key, bool) or not isinstance(key, int | str | bytes):
        raise MalformedIdError(f"block keys must be int, str or bytes, got {key!r}")
    return key


def check_context(value: object) -> tuple[BlockKey, ...]:
    if not isinstance(value, tuple):
        raise MalformedIdError(
            f"a context must be a tuple of block keys, got {type(value).__name__}"
        )
    for key in value:
        check_block_key(key)
    return value
