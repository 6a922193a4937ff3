"""What a W&B run records beyond the flags: its lineage as the group, tags, and where and with what
code it ran; and W&B out of reach or failing mid-run never ends a run. No W&B process is started:
the servers here are loopback sockets (closed, silent, or answering)."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.contract import Contract
from distrain_cloud.training.tracking import (
    WANDB_PROBE_ATTEMPTS,
    GuardedTracking,
    choose_wandb_run_id,
    code_hash,
    quiet_wandb_when_piped,
    start_wandb,
    wandb_base_url,
    wandb_settings,
    wandb_unreachable,
)


def contract(root: Path, source: str) -> Contract:
    return Contract(root / "model", root / "output", root / "first-job" / "checkpoints", source=source)


def test_a_resumed_local_job_joins_its_lineage_group(tmp_path):
    # --precision given: without it the entry point resolves one for the GPUs before W&B starts
    args = parse_args(["--run-name", "second-job", "--strategy", "zero2", "--task", "causal-lm", "--precision", "no"])
    s = wandb_settings(args, contract(tmp_path, "distrain"), {})
    # The lineage's checkpoint folder is the first job's: both jobs land in its group.
    assert s["group"] == "first-job" and s["config"]["lineage"] == "first-job"
    assert s["tags"] == ["causal-lm", "zero2", "no", "distrain"]
    assert s["config"]["job"] == "second-job"
    assert (
        wandb_settings(args, contract(tmp_path, "distrain"), {"DISTRAIN_INSTANCE_TYPE": "local"})["config"]["instance"]
        == "local"
    )
    assert s["config"]["code_hash"] == code_hash() and len(code_hash()) == 12


def test_a_sagemaker_job_names_its_instance_and_image(tmp_path):
    args = parse_args(["--run-name", "job-1"])
    env = {"SM_CURRENT_INSTANCE_TYPE": "ml.g5.2xlarge", "DISTRAIN_IMAGE_URI": "example.invalid/train:1"}
    s = wandb_settings(args, contract(tmp_path, "sagemaker"), env)
    assert s["group"] == "job-1"  # /opt/ml/checkpoints names no lineage: the job is its own group
    assert (s["config"]["instance"], s["config"]["image"]) == ("ml.g5.2xlarge", "example.invalid/train:1")
    # A backend that knows the lineage says so.
    assert wandb_settings(args, contract(tmp_path, "sagemaker"), {"DISTRAIN_LINEAGE": "first"})["group"] == "first"


def test_hub_private_needs_a_repo():
    with pytest.raises(ArgumentError, match="--hub-private applies to the repo --push-to-hub REPO creates"):
        parse_args(["--hub-private"])
    assert parse_args(["--hub-private", "--push-to-hub", "me/tiny"]).hub_private


def test_hub_revision_needs_a_repo_and_a_branch_name():
    with pytest.raises(ArgumentError, match="--hub-revision names a branch of the --push-to-hub REPO"):
        parse_args(["--hub-revision", "v2"])
    assert parse_args(["--push-to-hub", "me/tiny", "--hub-revision", "exp/lr-3e-4"]).hub_revision == "exp/lr-3e-4"
    for bad in ("a..b", "-x", "v2/", "refs/pr/1", "has space"):
        with pytest.raises(ArgumentError, match=f"--hub-revision '{bad}': "):
            parse_args(["--push-to-hub", "me/tiny", f"--hub-revision={bad}"])


def test_the_run_id_is_the_checkpoints_then_the_launchers_then_a_new_one():
    chosen = {"DISTRAIN_WANDB_RUN_ID": "job-20250101-000000-abcdef"}
    assert choose_wandb_run_id("a1b2c3d4", chosen) == "a1b2c3d4"  # a resumed job appends to its run
    assert choose_wandb_run_id(None, chosen) == "job-20250101-000000-abcdef"  # the URL the launcher printed
    fresh = choose_wandb_run_id(None, {})
    assert len(fresh) == 8 and int(fresh, 16) >= 0 and fresh != choose_wandb_run_id(None, {})
    # One W&B would refuse: a run still starts, under an id of its own.
    assert "/" not in choose_wandb_run_id(None, {"DISTRAIN_WANDB_RUN_ID": "a/b"})


# ---------------------------------------------------------------- W&B out of reach


def closed_port() -> int:
    """A loopback port nothing listens on: a connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def silent_server():
    """A server that accepts connections and never answers: a proxy or firewall that swallows them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for c in held:
            c.close()
        server.close()


@contextlib.contextmanager
def answering_server(status: int):
    """A server that answers every request with `status` (W&B's API answers 401 without a key)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_closed_wandb_endpoint_is_out_of_reach_in_about_a_second():
    url = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    why = wandb_unreachable({"WANDB_BASE_URL": url + "/", "NO_PROXY": "127.0.0.1"})
    assert why is not None and why.startswith(f"cannot reach {url}: "), why
    assert "refused" in why.lower(), why
    assert time.monotonic() - started < 4  # two refused connections and one second between them


def test_a_wandb_endpoint_that_never_answers_is_out_of_reach_within_the_probe_bound():
    with silent_server() as url:
        started = time.monotonic()
        why = wandb_unreachable({"WANDB_BASE_URL": url, "NO_PROXY": "127.0.0.1"}, timeout_s=0.5)
        took = time.monotonic() - started
    assert why is not None and why.startswith(f"cannot reach {url}: "), why
    assert "timed out" in why.lower(), why
    assert took < WANDB_PROBE_ATTEMPTS * 0.5 + 1.0 + 1.0, took  # bounded: never wandb's 90 s


@pytest.mark.parametrize("status", [200, 401, 503])
def test_any_http_answer_means_wandb_is_there(status):
    with answering_server(status) as url:
        assert wandb_unreachable({"WANDB_BASE_URL": url, "NO_PROXY": "127.0.0.1"}) is None


def test_the_wandb_server_is_found_as_the_sdk_finds_it(tmp_path):
    assert wandb_base_url({"WANDB_BASE_URL": " https://wandb.example.internal/ "}) == "https://wandb.example.internal"
    (tmp_path / "settings").write_text("[default]\nbase_url = https://self-hosted.example\n")
    assert wandb_base_url({"WANDB_CONFIG_DIR": str(tmp_path)}) == "https://self-hosted.example"
    assert wandb_base_url({"WANDB_CONFIG_DIR": str(tmp_path / "none")}) == "https://api.wandb.ai"
    (tmp_path / "settings").write_text("not an ini file")
    assert wandb_base_url({"WANDB_CONFIG_DIR": str(tmp_path)}) == "https://api.wandb.ai"
    assert "is not an http(s) URL" in (wandb_unreachable({"WANDB_BASE_URL": "ftp://x"}) or "")


class FakeTracker:
    def __init__(self, fail_finish: bool = False):
        self.finished, self.fail_finish = 0, fail_finish

    def finish(self):
        self.finished += 1
        if self.fail_finish:
            raise OSError("No space left on device")


class FakeAccelerator:
    """What start_wandb and GuardedTracking use of Accelerate's Accelerator on the main process;
    its W&B run starts only where `starts(mode)` says (the mode wandb.init would see)."""

    is_main_process = True
    num_processes = 1

    def __init__(self, starts=lambda mode: True, fail_log: bool = False):
        self.trackers: list = []
        self.starts, self.fail_log = starts, fail_log
        self.modes: list[str] = []
        self.logged: list = []

    def init_trackers(self, project_name, config, init_kwargs):
        self.trackers.append(FakeTracker())  # as Accelerate appends before it starts the tracker
        mode = os.environ.get("WANDB_MODE", "online")
        self.modes.append(mode)
        if not self.starts(mode):
            raise RuntimeError("CommError: Timed out while retrying: Post /graphql: context deadline exceeded\nmore")

    def get_tracker(self, name, unwrap=False):
        return type("Run", (), {"url": "https://wandb.example/run"})()

    def log(self, values, step=None):
        if self.fail_log:
            raise RuntimeError("The wandb backend process has shutdown")
        self.logged.append((step, values))

    def end_training(self):
        pass


@pytest.fixture
def wandb_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


def test_wandb_out_of_reach_goes_offline_with_one_line_naming_the_sync(tmp_path, wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    said: list[str] = []
    acc = FakeAccelerator()
    start_wandb(acc, parse_args(["--run-name", "j"]), contract(tmp_path, "distrain"), None, said.append)
    assert acc.modes == ["offline"]  # wandb.init never waits on a server it cannot reach
    wandb_dir = tmp_path / "output" / "wandb"
    (note,) = said
    assert note.startswith("note: W&B is out of reach (cannot reach http://127.0.0.1:"), note
    assert note.endswith(f"upload it later with `wandb sync {wandb_dir}/offline-run-*`"), note


def test_wandb_that_answers_then_fails_to_start_goes_offline_and_training_goes_on(tmp_path, wandb_env, monkeypatch):
    with answering_server(200) as url:
        monkeypatch.setenv("WANDB_BASE_URL", url)
        said: list[str] = []
        acc = FakeAccelerator(starts=lambda mode: mode == "offline")
        start_wandb(acc, parse_args(["--run-name", "j"]), contract(tmp_path, "distrain"), None, said.append)
    assert acc.modes == ["online", "offline"] and len(acc.trackers) == 1  # the failed tracker dropped
    (note,) = said
    assert note.startswith("note: W&B is out of reach (CommError: Timed out while retrying:"), note
    assert "more" not in note  # one line


def test_wandb_that_cannot_start_even_offline_leaves_the_run_untracked(tmp_path, wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    said: list[str] = []
    acc = FakeAccelerator(starts=lambda mode: False)
    run_id = start_wandb(acc, parse_args(["--run-name", "j"]), contract(tmp_path, "distrain"), None, said.append)
    assert run_id and acc.trackers == [] and acc.modes == ["offline"]
    assert said == [
        "note: W&B failed to start (CommError: Timed out while retrying: Post /graphql: context "
        "deadline exceeded): this run is not tracked"
    ]


@pytest.mark.parametrize("env, why", [({}, "no WANDB_API_KEY"), ({"WANDB_MODE": "offline"}, "WANDB_MODE=offline")])
def test_an_offline_run_says_where_it_is_and_how_to_upload_it(tmp_path, wandb_env, monkeypatch, env, why):
    # W&B's own lines (which said it) are silenced where output is piped, as a job's is.
    monkeypatch.delenv("WANDB_API_KEY")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    said: list[str] = []
    acc = FakeAccelerator()
    start_wandb(acc, parse_args(["--run-name", "j"]), contract(tmp_path, "distrain"), None, said.append)
    runs = tmp_path / "output" / "wandb"
    assert acc.modes == ["offline"]
    upload = f"upload it later with `wandb sync {runs}/offline-run-*`"
    assert said == [f"note: the W&B run is written offline ({why}); {upload}"]


def test_a_failing_wandb_log_mid_run_is_one_note_and_training_goes_on():
    said: list[str] = []
    acc = FakeAccelerator(fail_log=True)
    acc.trackers.append(FakeTracker())
    tracking = GuardedTracking(acc, said.append)
    tracking.log({"train_loss": 1.0}, step=3)
    tracking.log({"train_loss": 0.9}, step=4)  # tracking stopped: no second attempt, no second note
    assert acc.trackers == []
    assert said == [
        "note: W&B failed logging step 3 (The wandb backend process has shutdown): training goes on untracked "
        "from here; the metrics stay in metrics.jsonl (`distrain-cloud report JOB` plots them)"
    ]
    tracking.finish()  # nothing left to finish


def test_a_failing_wandb_finish_is_a_note_not_a_failed_run():
    said: list[str] = []
    acc = FakeAccelerator()
    tracker = FakeTracker(fail_finish=True)
    acc.trackers.append(tracker)
    GuardedTracking(acc, said.append).finish()
    assert tracker.finished == 1 and acc.trackers == []  # end_training will not finish it again
    assert said and said[0].startswith("note: W&B failed finishing the run (No space left on device)")


def test_a_wandb_finish_that_hangs_does_not_hold_the_job_up():
    said: list[str] = []
    acc = FakeAccelerator()
    release = threading.Event()
    tracker = FakeTracker()
    tracker.finish = lambda: release.wait(30)  # an upload that never gets through
    acc.trackers.append(tracker)
    started = time.monotonic()
    GuardedTracking(acc, said.append, finish_timeout_s=0.2).finish()
    assert time.monotonic() - started < 2
    release.set()
    assert acc.trackers == [] and said == [
        "note: W&B did not finish within 0.2 s (an upload that cannot get through?): the job ends without it; "
        "its files stay for `wandb sync`"
    ]


class Stream:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_wandb_is_silenced_where_output_is_not_a_terminal_unless_the_user_chose():
    env: dict[str, str] = {}
    assert quiet_wandb_when_piped(env, (Stream(True), Stream(False))) and env == {"WANDB_SILENT": "true"}
    env = {}
    assert not quiet_wandb_when_piped(env, (Stream(True), Stream(True))) and env == {}
    for chosen in ({"WANDB_SILENT": "false"}, {"WANDB_QUIET": "true"}):
        env = dict(chosen)
        assert not quiet_wandb_when_piped(env, (Stream(False), Stream(False))) and env == chosen


@pytest.mark.slow  # trains a tiny model (a few seconds) with W&B's real SDK, offline
def test_a_job_with_a_wandb_key_and_no_route_to_wandb_trains_and_writes_its_run_offline(train):
    # An API key but no route (a closed port standing for a VPC without egress): W&B used to wait
    # 90 s and fail the job before step 1 ("CommError ... context deadline exceeded").
    url = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    run = train(
        "--max-steps", "4", "--log-every", "2", "--save-every", "4",
        env={"WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": url, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"},
    )  # fmt: skip
    took = time.monotonic() - started
    assert run.returncode == 0, run.describe()
    assert len(run.train_losses) == 2 and len(run.evals) == 1
    wandb_dir = run.contract.output_dir / "wandb"
    (note,) = run.lines("note: W&B is out of reach")
    assert note.startswith(f"note: W&B is out of reach (cannot reach {url}: "), note
    assert note.endswith(f"`wandb sync {wandb_dir}/offline-run-*`"), note
    (offline,) = wandb_dir.glob("offline-run-*")
    assert list(offline.glob("*.wandb")), sorted(p.name for p in offline.iterdir())
    # Piped output: W&B silenced, so none of its colour codes reach the log.
    assert "\x1b[" not in run.stdout + run.stderr, repr((run.stdout + run.stderr)[-2000:])
    assert took < 80, took  # the probe's seconds, not W&B's 90 s wait


# ---------------------------------------------------------------- Hub repo ids, offline


GOOD_REPOS = ["me/tiny", "tiny", "me/x_y.z", "Org-1/Model.v2", "me/" + "a" * 96]
BAD_REPOS = ["bad id!!", "a/b/c", "me/--x", "me/x..y", "me/" + "a" * 97, "me/x.git", "-x/y", "me/x-", "", "/x", "x/"]


@pytest.mark.parametrize("repo", BAD_REPOS)
def test_a_repo_id_that_cannot_exist_is_refused_before_training(repo):
    with pytest.raises(ArgumentError, match=f"--push-to-hub {repo!r} is not a Hub repo id: a repo id is NAME or"):
        parse_args([f"--push-to-hub={repo}"])


def test_the_repo_id_rules_are_huggingface_hubs_with_or_without_it(monkeypatch):
    """The launcher may run without huggingface_hub (a lean install): its stand-in agrees with
    huggingface_hub's validate_repo_id on every case here."""
    import builtins

    from distrain_cloud.training.args import repo_id_problem

    with_hub = [repo_id_problem(r) is None for r in GOOD_REPOS + BAD_REPOS]
    real_import = builtins.__import__

    def no_hub(name, *args, **kwargs):
        if name.startswith("huggingface_hub"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    without = [repo_id_problem(r) is None for r in GOOD_REPOS + BAD_REPOS]
    assert with_hub == without == [True] * len(GOOD_REPOS) + [False] * len(BAD_REPOS)
