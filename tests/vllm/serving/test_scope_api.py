"""``retire serve``'s scope API and its edges: pause, resume, cancel and status; a client that
disconnects; tenants; headers; bad and hostile input (a 4xx in OpenAI's error format, nothing
changed); the ``retire_`` metrics on vLLM's ``/metrics``; idle scopes expiring; the core log on
disk."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retire_bench.servers import HTTP, RetireServer
from retire_bench.serving import _server_timing
from retire_vllm.client import ScopeReader, incarnation, read_stream, scoped, stamp
from retire_vllm.serving import wire
from retire_vllm.serving.records import API_PARTS, ENGINE_HOOKS
from tests.vllm.serving_support import (
    BLOCK,
    cancel,
    complete,
    fresh_connections,
    hunt_window,
    interrupt,
    open_scoped_stream,
    pause_running,
    prompt,
    retire_metrics,
    status,
)

pytestmark = pytest.mark.vllm


def test_a_pause_withholds_a_version_whose_request_has_not_run_yet(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    """A pause taken while the version's request still waits for its first step (behind another
    request's long prefill) withholds it from vLLM's waiting queue too: nothing of it is
    scheduled and nothing reaches the client (not even the response's headers) until the
    unpause; then it runs to its end. (Before, only running requests were withheld: the waiting
    one was prefilled while paused and its first token published.)"""
    model = retire_server.model

    tries = itertools.count()

    async def attempt(k: int, delay: float) -> str:
        c = retire_server.openai(asynchronous=True)
        scope, url = f"withheld-{k}", retire_server.scope_url(f"withheld-{k}")
        busy = asyncio.create_task(complete(c, model, prompt(8000 + k, 3000), 1))
        await asyncio.sleep(0.01)
        opened = asyncio.create_task(open_scoped_stream(c, model, scope, prompt(8100 + k, 64), 16))
        await asyncio.sleep(delay)
        async with fresh_connections() as h:
            paused = await h.post(f"{url}/pause")
            if paused.status_code != 200:  # not opened yet, or its version ran to its end
                state = await h.get(url)
                finished = state.status_code == 200 and state.json()["state"] == "finished"
                answer = "late" if finished else "early"
            elif paused.json()["pages"]:
                answer = "late"  # its request had run a step
            else:
                answer = "hit"
                await asyncio.sleep(0.5)
                assert not opened.done(), "a paused version published"
                assert not (await h.get(url)).json()["pages"], "a paused version was scheduled"
            if paused.status_code == 200:
                (await h.post(f"{url}/resume")).raise_for_status()
        chunks = await read_stream(await opened)
        assert chunks[-1].choices[0].finish_reason == "length"
        await busy
        await c.close()
        assert cancel(retire_server, scope).status_code == 200
        return answer

    hunt_window(lambda delay: asyncio.run(attempt(next(tries), delay)))


def test_pause_resume_cancel_and_status(client: openai.OpenAI, retire_server: RetireServer) -> None:
    model, base = retire_server.model, retire_server.base
    complete(client, model, prompt(30, 70), 4, **scoped("api"))
    info = status(retire_server, "api").json()
    assert info["state"] == "finished" and info["version"] == 0
    assert info["receipts_outstanding"] == 0
    idle = HTTP.post(f"{base}/v1/scopes/api/pause")  # nothing runs that could be paused
    assert idle.status_code == 409 and idle.json()["error"]["code"] == "illegal_scope_transition"
    # Paused, a version cannot reach its end: what follows does not race the engine.
    resumed = pause_running(client, retire_server, prompt(31, 70), "api", max_tokens=400)
    again = HTTP.post(f"{base}/v1/scopes/api/pause")
    assert again.status_code == 409 and again.json()["error"]["code"] == "illegal_scope_transition"
    assert status(retire_server, "api").json()["state"] == "paused"
    assert HTTP.post(f"{base}/v1/scopes/api/resume").json()["state"] == "active"
    rest = [ch for ch in resumed]
    assert rest[-1].choices[0].finish_reason == "length"  # resumed, it runs to its end
    assert status(retire_server, "api").json()["state"] == "finished"
    cancelled = pause_running(client, retire_server, prompt(32, 70), "api")
    assert cancel(retire_server, "api").json()["state"] == "cancelled"
    assert [ch for ch in cancelled][-1].choices[0].finish_reason == "cancelled"
    gone = complete_error(client, model, scoped("api"))
    assert gone.status_code == 409 and gone.body["error"]["code"] == "scope_cancelled"


def test_a_disconnected_client_ends_its_version_and_the_scope_stays_live(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    model = retire_server.model
    base = prompt(40, 150)
    version = interrupt(client, retire_server, base, "gone")  # the client goes away
    info = status(retire_server, "gone").json()
    assert info["state"] == "active" and info["version"] == version
    assert info["receipts_outstanding"] == 0
    after = complete(client, model, [*base, 7, 8, 9], 4, **scoped("gone"))
    assert after.usage.prompt_tokens_details.cached_tokens == (len(base) // BLOCK) * BLOCK
    assert cancel(retire_server, "gone").status_code == 200


def test_the_server_is_a_process_group_in_the_tests_session(retire_server: RetireServer) -> None:
    """Its own group, so that stopping it stops every process of it; the tests' session, so that
    the kernel's per-session scheduling (autogroup) cannot keep the tests' client off the CPUs
    while the server is busy, as it did a whole version long (``servers.Server``)."""
    pid = retire_server.proc.pid
    assert os.getpgid(pid) == pid
    assert os.getsid(pid) == os.getsid(0)


def test_two_tenants_share_no_page(client: openai.OpenAI, retire_server: RetireServer) -> None:
    model = retire_server.model
    base = prompt(50, 130)
    for tenant in ("acme", "globex"):
        complete(client, model, base, 4, **scoped(f"t-{tenant}", tenant))
    pages = {t: set(status(retire_server, f"t-{t}", t).json()["pages"]) for t in ("acme", "globex")}
    assert pages["acme"] and pages["globex"] and not pages["acme"] & pages["globex"]
    for tenant in ("acme", "globex"):
        again = complete(client, model, [*base, 1, 2], 4, **scoped(f"t-{tenant}", tenant))
        assert again.usage.prompt_tokens_details.cached_tokens == 4 * BLOCK
        now = set(status(retire_server, f"t-{tenant}", tenant).json()["pages"])
        other = "globex" if tenant == "acme" else "acme"
        assert not now & pages[other]
    stolen = complete_error(client, model, scoped("t-acme", "globex"))
    assert stolen.status_code == 403
    assert status(retire_server, "t-acme", "globex").status_code == 403
    for tenant in ("acme", "globex"):
        assert cancel(retire_server, f"t-{tenant}", tenant).status_code == 200


class _Error:
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code, self.body = status_code, body


def complete_error(c: openai.OpenAI, model: str, body: dict[str, Any], **kw: Any) -> _Error:
    try:
        c.completions.create(
            model=model,
            prompt=[5, 6, 7],
            max_tokens=2,
            temperature=kw.pop("temperature", 0),
            extra_body={"ignore_eos": True, **body},
            **kw,
        )
    except openai.APIStatusError as err:
        return _Error(err.status_code, err.response.json())
    raise AssertionError("the request was accepted")


@pytest.mark.parametrize(
    "body, temperature, status_code, code, refused_by_engine",
    [
        (scoped("bad scope!"), 0, 400, "invalid_scope_request", True),
        (scoped("x" * 200), 0, 400, "invalid_scope_request", True),
        (scoped("ok", "bad tenant!"), 0, 400, "invalid_scope_request", True),
        (scoped("sampled"), 0.7, 400, "contract_not_inheritable", True),
        (
            {"vllm_xargs": {"retire_scope": "v", "retire_version": 3}},
            0,
            400,
            "invalid_scope_request",
            False,
        ),
        (
            {"vllm_xargs": {"retire_scope": "v", "retire_opening": "forged"}},
            0,
            400,
            "invalid_scope_request",
            False,
        ),
    ],
)
def test_bad_scope_requests_get_a_4xx_and_change_nothing(
    client: openai.OpenAI,
    retire_server: RetireServer,
    body: dict[str, Any],
    temperature: float,
    status_code: int,
    code: str,
    refused_by_engine: bool,
) -> None:
    """A bad scoped request gets its 4xx in OpenAI's format and changes nothing. One the API
    process can refuse sends nothing; one the authority refuses had its request sent right
    behind its open: the engine side ends that request unopened (it never runs, scoped or not),
    and nothing is left (the fixture)."""

    def unopened() -> int:
        return int(retire_server.leaks()["counters"].get("unopened_requests", 0))

    before, ended = retire_server.leaks(), unopened()
    err = complete_error(client, retire_server.model, body, temperature=temperature)
    assert (err.status_code, err.body["error"]["code"]) == (status_code, code)
    assert set(err.body["error"]) == {"message", "type", "code"}
    after = retire_server.leaks()
    assert after["live_scopes"] == before["live_scopes"] == []
    deadline = time.monotonic() + 10  # the request reaches the engine core just after its open
    while refused_by_engine and unopened() == ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert unopened() - ended == int(refused_by_engine)


@pytest.mark.parametrize(
    "method, path, status_code",
    [
        ("GET", "/v1/scopes/never-opened", 404),
        ("POST", "/v1/scopes/never-opened/cancel", 404),
        ("POST", "/v1/scopes/never-opened/pause", 404),
        ("GET", "/v1/scopes/" + "y" * 300, 400),
        ("POST", "/v1/scopes/x/explode", 404),
        ("DELETE", "/v1/scopes/x", 404),
    ],
)
def test_bad_scope_routes(
    client: openai.OpenAI, retire_server: RetireServer, method: str, path: str, status_code: int
) -> None:
    r = HTTP.request(method, f"{retire_server.base}{path}")
    assert r.status_code == status_code
    assert set(r.json()["error"]) == {"message", "type", "code"}


def test_headers_put_a_request_under_a_scope(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    r = HTTP.post(
        f"{retire_server.base}/v1/completions",
        headers={"x-retire-scope": "hdr", "x-retire-tenant": "acme"},
        json={
            "model": retire_server.model,
            "prompt": "hello there",
            "max_tokens": 3,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    incarnation = int(r.headers["x-retire-incarnation"])
    assert r.json()["retire"] == {"scope": "hdr", "version": 0, "incarnation": incarnation}
    assert r.headers["x-retire-version"] == "0"
    assert status(retire_server, "hdr", "acme").json()["incarnation"] == incarnation > 0
    assert cancel(retire_server, "hdr", "acme").status_code == 200


def test_a_scoped_response_says_where_its_opening_spent_its_time(
    retire_server: RetireServer,
) -> None:
    """``Server-Timing`` on a scope's responses (a new scope and a revision of it, which fenced
    nothing: the first version had ended): every phase of ``wire.SERVER_TIMING_PHASES`` but
    ``retire-fence`` once, in order, none negative, together within the time the client waited;
    a request without a scope carries none. (A revision that fences a running version:
    ``test_the_old_stream_ends_at_once_with_superseded``.)"""
    body = {"model": retire_server.model, "max_tokens": 3, "temperature": 0}
    phases = [name for name in wire.SERVER_TIMING_NAMES if name != "retire-fence"]
    for text in ("hello there", "hello again"):
        began = time.time()
        r = HTTP.post(
            f"{retire_server.base}/v1/completions",
            headers={"x-retire-scope": "timed"},
            json={**body, "prompt": text},
        )
        waited_ms = 1000 * (time.time() - began)
        assert r.status_code == 200, r.text
        timing = _server_timing(r.headers["server-timing"])
        assert list(timing) == phases
        assert min(timing.values()) >= 0 and sum(timing.values()) <= waited_ms, timing
    plain = HTTP.post(f"{retire_server.base}/v1/completions", json={**body, "prompt": "hi"})
    assert plain.status_code == 200 and "server-timing" not in plain.headers
    assert cancel(retire_server, "timed").status_code == 200


def test_an_idle_engines_core_log_is_on_disk(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    """vLLM's shutdown kills the engine core before the scheduler's ``shutdown`` runs, so the
    lines of a version that ran to its end must reach the disk once the engine has nothing left
    to run, with no scope call after them (a call's answer makes its own lines durable)."""
    assert retire_server.core_log is not None
    complete(client, retire_server.model, prompt(77, 40), 4, **scoped("durable"))
    lines = [json.loads(line) for line in retire_server.core_log.read_text().splitlines()]
    mine = [line["transition"] for line in lines if line.get("scope") == "durable"]
    assert mine[0] == "open" and "finish" in mine, mine
    assert cancel(retire_server, "durable").status_code == 200


def test_metrics_extend_vllms_own(client: openai.OpenAI, retire_server: RetireServer) -> None:
    model = retire_server.model
    base = prompt(60, 100)
    complete(client, model, base, 4, **scoped("metered"))
    complete(client, model, [*base, 3], 4, **scoped("metered"))
    assert cancel(retire_server, "metered").status_code == 200
    text = HTTP.get(f"{retire_server.base}/metrics", headers={"accept-encoding": "gzip"}).text
    # vLLM's own /metrics body is still there, uncompressed (this server runs without vLLM's
    # engine stats, so its process metrics stand for it)
    assert "python_gc_objects_collected_total" in text
    values = retire_metrics(retire_server)
    assert values["retire_supersedes_total"] >= 1
    assert values["retire_adopted_blocks_total"] >= 3
    assert values['retire_cleanup_seconds_bucket{le="+Inf"}'] >= 2  # the revision and the cancel
    assert values["retire_live_scopes"] == 0
    assert 'retire_obsolete_frames_dropped_total{boundary="consumer"}' in values
    # the engine core's time in Retire's hooks: every hook named, the in-step ones within the
    # steps they ran in
    hook = {h: values[f'retire_engine_hook_seconds_total{{hook="{h}"}}'] for h in ENGINE_HOOKS}
    assert values["retire_engine_steps_total"] >= 8  # two versions' prefills and decodes
    assert min(hook["schedule"], hook["commit"], hook["utility"], hook["add_request"]) > 0
    assert hook["schedule"] + hook["commit"] < values["retire_engine_step_seconds_total"]
    # the blocks the steps filled were digested by the workers within those steps (the
    # connector ``retire serve`` installs), and those digests passed the byte check that the
    # revision's adoption read after the fact (a digest of other bytes, or of the layers in
    # another order, would have failed it); the byte check itself is a round trip, waited for
    assert values["retire_blocks_digested_in_step_total"] >= 3
    assert values["retire_verification_failures_total"] == 0
    assert 0 < values["retire_engine_worker_wait_seconds_total"] < sum(hook.values())
    # what the workers' digests within the steps cost those steps, counted apart from the hooks
    digesting = values["retire_engine_worker_digest_seconds_total"]
    assert 0 < digesting < values["retire_engine_step_seconds_total"]
    # the API process's own part: both scoped versions' outputs went through the publication
    # check, and both parts of its per-output code were timed
    assert values["retire_api_outputs_total"] >= 2
    for part in API_PARTS:
        assert values[f'retire_api_seconds_total{{part="{part}"}}'] > 0


def test_a_version_ending_by_length_closes_its_last_block_with_the_steps_digest(
    client: openai.OpenAI, retire_server: RetireServer
) -> None:
    """Its last step is known when it is scheduled, so the workers digest its partial last block
    within that step, as they do the blocks a step fills: closing its writers waits for no
    round trip to the workers after the step."""
    before = retire_metrics(retire_server)
    done = complete(client, retire_server.model, prompt(70, BLOCK + 8), 4, **scoped("ending"))
    assert done.choices[0].finish_reason == "length"
    after = retire_metrics(retire_server)
    taken = "retire_blocks_digested_in_step_total"
    # the full block at the prefill's commit, the partial one at the last step's
    assert after[taken] - before[taken] == 2
    waited = "retire_engine_worker_wait_seconds_total"
    assert after[waited] == before[waited]
    assert cancel(retire_server, "ending").status_code == 200


def test_idle_scopes_expire(client: openai.OpenAI, retire_server: RetireServer) -> None:
    model = retire_server.model
    complete(client, model, prompt(70, 40), 2, **scoped("idle-a"))
    late = complete(client, model, prompt(69, 40), 2, **scoped("idle-a"))  # version 1
    old = pause_running(
        client, retire_server, prompt(71, 40), "busy"
    )  # a paused request stays live
    expire = f"{retire_server.base}/v1/retire/expire"
    assert HTTP.post(expire, json={"idle_seconds": 3600}).json()["expired"] == []
    assert HTTP.post(expire, json={"idle_seconds": 0}).json()["expired"] == ["idle-a"]
    assert status(retire_server, "idle-a").json()["state"] == "cancelled"
    assert HTTP.post(expire, json={"idle_seconds": -1}).status_code == 400
    assert status(retire_server, "busy").json()["state"] == "paused"  # kept
    assert cancel(retire_server, "busy").status_code == 200
    assert [ch for ch in old][-1].choices[0].finish_reason == "cancelled"
    # A cancelled scope answers ``scope_cancelled`` for one idle time, then it is forgotten: its
    # record goes, and its id opens a new scope at version 0.
    records = retire_server.leaks()["scope_records"]
    assert HTTP.post(expire, json={"idle_seconds": 3600}).json()["forgotten"] == []
    assert complete_error(client, model, scoped("idle-a")).status_code == 409
    forgotten = HTTP.post(expire, json={"idle_seconds": 0}).json()["forgotten"]
    assert {"idle-a", "busy"} <= set(forgotten)  # and the earlier tests' cancelled scopes
    assert retire_server.leaks()["scope_records"] == records - len(forgotten)
    assert status(retire_server, "idle-a").status_code == 404
    again = complete(client, model, prompt(72, 40), 2, **scoped("idle-a"))
    assert stamp(again) == ("idle-a", 0)
    # A reader that outlived the first scope of that id takes the new one's version 0 as the
    # newest, not as older than the first one's version 1 (the incarnation orders first).
    assert incarnation(again) > incarnation(late) > 0
    reader = ScopeReader()
    assert reader.admit(late) and reader.admit(again) and not reader.admit(late)
    assert cancel(retire_server, "idle-a").status_code == 200


# --- hostile input --------------------------------------------------------------------------------

_HOSTILE_IDS = st.one_of(
    st.sampled_from(["fz-a", "fz-b", "sentinel", "", " ", "a/b", "../x", "%2F", "x" * 129, "é"]),
    st.text(max_size=200),
    st.integers(),
    st.lists(st.text(max_size=3), max_size=2),
    st.none(),
)
_FUZZ_OPS = st.tuples(
    st.sampled_from(["complete", "stream", "cancel", "pause", "resume", "status"]),
    _HOSTILE_IDS,
    st.one_of(st.none(), _HOSTILE_IDS),  # tenant
    st.sampled_from([0, 0.5]),  # temperature
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_FUZZ_OPS, min_size=1, max_size=6))
def test_hostile_scope_requests_get_4xx_never_5xx_and_disturb_no_other_scope(
    retire_server: RetireServer, ops: list[tuple[str, Any, Any, float]]
) -> None:
    base, model = retire_server.base, retire_server.model
    if (
        HTTP.get(f"{base}/v1/scopes/sentinel", headers={"x-retire-tenant": "guard"}).status_code
        != 200
    ):
        body = {"model": model, "prompt": prompt(90, 40), "max_tokens": 2, "temperature": 0}
        body["vllm_xargs"] = {"retire_scope": "sentinel", "retire_tenant": "guard"}
        assert HTTP.post(f"{base}/v1/completions", json=body).status_code == 200
    guard = {"x-retire-tenant": "guard"}
    before = HTTP.get(f"{base}/v1/scopes/sentinel", headers=guard).json()
    for op, scope, tenant, temperature in ops:
        xargs: dict[str, Any] = {"retire_scope": scope}
        if tenant is not None:
            xargs["retire_tenant"] = tenant
        if op in ("complete", "stream"):
            r = HTTP.post(
                f"{base}/v1/completions",
                json={
                    "model": model,
                    "prompt": prompt(91, 40),
                    "max_tokens": 2,
                    "temperature": temperature,
                    "stream": op == "stream",
                    "vllm_xargs": xargs,
                },
                timeout=60,
            )
        else:
            path = {"status": "", "cancel": "/cancel", "pause": "/pause", "resume": "/resume"}[op]
            sendable = (  # what HTTP can carry in a header at all
                isinstance(tenant, str) and tenant.isascii() and tenant.isprintable()
            )
            headers = {"x-retire-tenant": tenant.strip()} if sendable and tenant.strip() else {}
            method = "GET" if op == "status" else "POST"
            url = retire_server.scope_url(str(scope)) + path
            r = HTTP.request(method, url, headers=headers, timeout=60)
        assert r.status_code < 500, (op, scope, tenant, r.status_code, r.text[:300])
        if r.status_code >= 400:
            assert set(r.json()["error"]) >= {"message", "type", "code"}, r.text[:300]
    after = HTTP.get(f"{base}/v1/scopes/sentinel", headers=guard).json()
    assert after == before  # no hostile request disturbed another scope
    retire_server.release_all()
    retire_server.check_clean()
