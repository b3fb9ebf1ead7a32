"""Suite-wide rules: a run in which no test passed, or any test was skipped, fails; every
``RetireEngine`` a test builds keeps the core's log and has it validated (``core_logs``); under
pytest-xdist (``make test`` runs ``-n auto``) every test that drives vLLM runs on one worker, one
after another, while the other workers take the pure-Python checks (``VLLM_TESTS``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from retire_vllm import corelog


@pytest.fixture(autouse=True)
def core_logs(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Every ``RetireEngine`` the test builds -- in this process, or in a process it starts
    (``retire replay``, the TP=2 scenario) -- writes the core's log into this directory and
    validates it against the spec when it closes (``retire_vllm.corelog``); a rejected log fails
    the test. A log whose engine the test left open is validated here, at teardown."""
    directory = tmp_path_factory.mktemp("core-logs")
    monkeypatch.setenv(corelog.LOG_DIR_ENV, str(directory))
    before = set(corelog.unfinished())
    yield directory
    for log in corelog.unfinished():
        if log not in before:
            log.finish()


#: Where the tests that drive vLLM live (nodeid prefixes): under xdist they run on one worker, one
#: after another (``pytest_xdist_make_scheduler``), while the pure-Python checks fill the other
#: workers. Two engines on the same few cores would slow each other down and make the runs that
#: exercise a race (a revision while a step is in flight) depend on the other worker's load.
VLLM_TESTS = (
    "tests/vllm/",
    "tests/test_bench_arms.py",
    "tests/test_bench_interleave.py",
    "tests/test_bench_vllm.py",
)


@pytest.hookimpl(optionalhook=True)  # (only called with pytest-xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's load-by-scope scheduler with one scope for every vLLM test (the largest, so it is
    handed out first) and one per test for the rest. (Its ``xdist_group`` marks cannot do this
    under pytest 9.2, whose node ids xdist 3.8 no longer renames.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class VllmTestsTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "vllm" if nodeid.startswith(VLLM_TESTS) else nodeid

    return VllmTestsTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stray = [
        item.nodeid
        for item in items
        if item.get_closest_marker("vllm") is not None and not item.nodeid.startswith(VLLM_TESTS)
    ]
    if stray:
        raise pytest.UsageError(
            f"vLLM tests outside tests/conftest.py's VLLM_TESTS (add their file): {stray}"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    worker = hasattr(session.config, "workerinput")  # an xdist worker: the controller judges
    if reporter is None or worker or session.config.option.collectonly:  # listing runs none
        return
    passed = len(reporter.stats.get("passed", []))
    skipped = len(reporter.stats.get("skipped", []))
    if exitstatus == 0 and (passed == 0 or skipped):
        reporter.write_line(
            f"FAILED: {passed} passed, {skipped} skipped — a run must pass tests and skip none"
        )
        session.exitstatus = 1


def pytest_ignore_collect(collection_path: object, config: pytest.Config) -> bool | None:
    """``make test-core`` (``-m "not vllm"``) deselects every vLLM test; it must not import
    their package either (its conftest needs the vLLM extras, which a core-only setup lacks).
    ``tests/mutation`` is collected only by ``make mutation`` (``RETIRE_MUTATION`` set)."""
    from pathlib import Path

    here = Path(__file__).parent
    if Path(str(collection_path)) == here / "mutation" and not os.environ.get("RETIRE_MUTATION"):
        return True  # the explorer half of ``make mutation``'s kill command (retire check runs)
    if config.getoption("markexpr", "") == "not vllm" and Path(str(collection_path)) == (
        here / "vllm"
    ):
        return True
    return None
