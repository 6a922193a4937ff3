"""Shared fixtures. AWS tests never touch real AWS: fake credentials, then moto's mock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def no_aws_config(monkeypatch, tmp_path):
    """No AWS_* variables and empty config/credentials files: nothing of the developer's ~/.aws."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def aws_credentials(no_aws_config, monkeypatch):
    """Fake credentials and region, on top of no_aws_config."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SECURITY_TOKEN", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session", autouse=True)
def moto_answers_one_request_at_a_time() -> Iterator[None]:
    """AWS applies each request atomically; moto's backends are plain dicts with no locks.

    Node agents run on threads here (and nodes in processes talk to a moto server's threads), so
    two PutObjects of one key at once could have moto close the buffer of the object the other
    request is still answering with: an error no S3 ever returns (a CI run failed on it). One lock
    around the whole of moto's handling of a request, in process and in its server alike, gives
    each request the atomicity AWS gives it; the requests' order stays as free as on AWS.
    """
    import threading

    from moto.core.botocore_stubber import BotocoreStubber
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    lock = threading.RLock()

    def serialized(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return method(*args, **kwargs)

        return call

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BotocoreStubber, "process_request", serialized(BotocoreStubber.process_request))
        mp.setattr(DomainDispatcherApplication, "__call__", serialized(DomainDispatcherApplication.__call__))
        yield


@pytest.fixture(scope="session", autouse=True)
def moto_plays_ec2_network() -> Iterator[None]:
    """moto implements no EC2 placement groups and deletes security groups still in use:
    tests/ec2_network.py plays AWS's rules (in process and in a moto server of this process alike)."""
    from ec2_network import play

    with pytest.MonkeyPatch.context() as mp:
        play(mp)
        yield


@pytest.fixture(autouse=True)
def no_placement_groups_left() -> None:
    """Each test starts with none of an earlier test's played placement groups (moto's own state
    is new per `mock_aws`)."""
    from ec2_network import DELETED, GROUPS

    GROUPS.clear()
    DELETED.clear()


@pytest.fixture
def mocked_aws(aws_credentials):
    """moto's in-process mock of every AWS service, with fake credentials in place."""
    import moto

    with moto.mock_aws():
        yield


@pytest.fixture
def aws_calls(aws_credentials, monkeypatch):
    """Every AWS API call botocore is asked to make, refused and recorded ("sts.GetCallerIdentity").

    With credentials present, a refusal that happens before the first call leaves this list empty."""
    import botocore.client

    calls: list[str] = []

    def refuse(self, operation_name, api_params):
        calls.append(f"{self.meta.service_model.service_name}.{operation_name}")
        raise AssertionError(f"AWS was called: {calls[-1]}")

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", refuse)
    return calls


@pytest.fixture(autouse=True)
def no_user_defaults(tmp_path_factory, monkeypatch):
    """No ~/.config/distrain-cloud/config.yaml and no DISTRAIN_<KEY> defaults of the developer's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config-home")))
    for key in ("REGION", "STACK", "BUCKET", "ROLE", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(f"DISTRAIN_{key}", raising=False)


@pytest.fixture(autouse=True)
def job_records(tmp_path_factory, monkeypatch):
    """Each test keeps its job records (written at submit) in a folder of its own, not in ~."""
    home = tmp_path_factory.mktemp("distrain-home")
    monkeypatch.setenv("DISTRAIN_HOME", str(home))
    return home / "jobs"


@pytest.fixture
def stub_client(aws_credentials, monkeypatch) -> Iterator[Callable[..., Any]]:
    """`stub_client(service, region="us-east-1")` -> an active botocore Stubber on the one client
    that infra.aws.client hands out for `service` from then on; other services get real clients.
    Responses queued and never asked for fail the test."""
    from botocore.stub import Stubber

    from distrain_cloud.infra import aws

    real = aws.client
    stubbed: dict[str, Any] = {}
    stubbers: list[Stubber] = []

    def client(service: str, region: str | None = None, **kwargs: Any) -> Any:
        return stubbed[service] if service in stubbed else real(service, region, **kwargs)

    def stub(service: str, region: str = "us-east-1") -> Stubber:
        stubbed[service] = real(service, region)
        stubber = Stubber(stubbed[service])
        stubber.activate()
        stubbers.append(stubber)
        monkeypatch.setattr(aws, "client", client)
        return stubber

    yield stub
    for stubber in stubbers:
        stubber.assert_no_pending_responses()


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`cli(*args, cwd, env=None, timeout=120)`: `distrain-cloud ARGS` as a user runs it, in a process
    of its own. `env` is its whole environment (default: this one, with one OpenMP thread).
    Tests that use it are marked slow (below): each process pays the CLI's imports again."""

    def run(
        *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "distrain_cloud.launcher.cli", *args],
            cwd=cwd,
            env=dict(env) if env is not None else {**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


# pyproject's addopts give the two xdist workers whole files (--dist loadfile) in the order
# collected (--no-loadscope-reorder; xdist's own order puts files of many tests first, which left
# the long training files to start last while the other worker had nothing left). Longest first:
# each file's seconds in the last full run, recorded by bench/suite_time.py. A file not recorded
# yet counts as a middling one.
DURATIONS = Path(__file__).with_name("durations.json")
UNRECORDED_FILE_S = 10.0


def recorded_file_seconds() -> dict[str, float]:
    try:
        files = json.loads(DURATIONS.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # no record: collection order
    return {str(k): float(v) for k, v in files.items()} if isinstance(files, dict) else {}


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cli" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    seconds = recorded_file_seconds()
    if seconds:
        # stable: each file's tests stay together and in their order
        items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], UNRECORDED_FILE_S))


# The fast lane (`-m "not slow"`) stays fast only if slow tests are marked: name the ones that are not.
FAST_TEST_LIMIT_S = 3.0
_unmarked_slow: list[tuple[float, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > FAST_TEST_LIMIT_S and "slow" not in report.keywords:
        _unmarked_slow.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _unmarked_slow:
        terminalreporter.write_sep("=", f"not marked slow, yet over {FAST_TEST_LIMIT_S:.0f} s (mark them slow)")
        for seconds, nodeid in sorted(_unmarked_slow, reverse=True):
            terminalreporter.write_line(f"{seconds:5.1f} s  {nodeid}")


@pytest.fixture(autouse=True)
def no_periodic_thread_outlives_its_test() -> Iterator[None]:
    """Every thread a node agent starts to repeat work (heartbeats, checkpoint syncs, the cost
    clock: `agent.job.Periodic`) must be ended by the agent. On a node the process ends anyway, but tests run
    agents on threads of this process: a clock left ticking wrote to S3 a minute later, inside
    another test's no-AWS-call fixture (a full run failed on it)."""
    import threading
    import time

    before = set(threading.enumerate())
    yield

    def periodic_left() -> list[threading.Thread]:
        return [
            t
            for t in threading.enumerate()
            if t not in before
            and t.is_alive()
            and type(getattr(getattr(t, "_target", None), "__self__", None)).__name__ == "Periodic"
        ]

    deadline = time.monotonic() + 2.0
    while periodic_left() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = periodic_left()
    assert not left, f"{len(left)} periodic agent thread(s) outlived the test: {left}"


@pytest.fixture(autouse=True)
def nodes_boot_when_their_agent_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost clock counts an instance from its kernel's boot (/proc/uptime). Node agents in tests
    run on this machine, up for hours: each would be billed from the test machine's boot, and a
    rehearsal with --max-cost passed or failed by how long the machine had been up (one failed at
    1 h 53 min of uptime). Here a node boots when its agent starts; tests that mean otherwise set
    their own."""
    import time

    from distrain_cloud.launcher.backends.ec2.agent import costclock

    monkeypatch.setattr(costclock, "boot_time", lambda now=None: time.time() if now is None else now)
