"""The local backend's plan, and the CLI end to end on the offline default."""

import fnmatch
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.spec import load_spec
from distrain_cloud.training.stopping import ProcessTree


def local_spec(tmp_path, **overrides):
    return load_spec(None, {"local": {"workdir": str(tmp_path / "runs")}, **overrides})


def test_plan_lays_out_the_contract_and_renders_configs(tmp_path):
    plan = plan_job(
        local_spec(tmp_path, strategy="zero2", train_args=["--batch-size", "4"], **{"local.processes": 2}), dry_run=True
    )
    env, root = plan.request["env"], Path(plan.request["cwd"])
    assert root.parent == (tmp_path / "runs").resolve() and not root.exists()
    assert env["DISTRAIN_MODEL_DIR"] == str(root / "model")
    assert env["DISTRAIN_CHECKPOINT_DIR"] == str(root / "checkpoints")
    assert env["DS_ACCELERATOR"] == "cpu"
    assert plan.configs["accelerate_config"]["num_processes"] == 2
    ds = plan.configs["deepspeed_config"]
    assert ds["zero_optimization"]["stage"] == 2 and ds["train_batch_size"] == 4 * 1 * 2
    assert plan.request["command"][-2:] == ["--batch-size", "4"]
    assert all(c.ok for c in plan.checks)


def test_the_plan_shows_the_secret_wrapper_with_references_only(tmp_path):
    ref = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token"
    plan = plan_job(local_spec(tmp_path, secrets={"HF_TOKEN": ref}), dry_run=True)
    # What --dry-run prints is what runs: the wrapper resolves the reference inside the job.
    assert plan.request["command"][1:4] == ["-m", "distrain_cloud.infra.secret_env", "--"]
    assert json.loads(plan.request["env"]["DISTRAIN_SECRETS"]) == {"HF_TOKEN": ref}


def test_job_names_are_unique(tmp_path):
    names = {plan_job(local_spec(tmp_path), dry_run=True).job_name for _ in range(20)}
    assert len(names) == 20


def test_local_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(UserError, match="--nodes 2: the local backend runs one node"):
        plan_job(local_spec(tmp_path, nodes=2))
    with pytest.raises(UserError, match="--precision bf16 needs a GPU"):
        plan_job(local_spec(tmp_path, precision="bf16"))
    with pytest.raises(UserError, match="strategy 'single' runs one process"):
        plan_job(local_spec(tmp_path, strategy="single", **{"local.processes": 2}))


def test_dry_run_prints_the_plan_and_runs_nothing(cli, tmp_path):
    r = cli("submit", "--instance", "local", "--dry-run", "--json", "--", "--max-steps", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["backend"] == "local" and plan["request"]["command"][-2:] == ["--max-steps", "3"]
    assert plan["summary"]["strategy"] == "ddp (auto: one process)"  # the default, resolved for this machine
    assert not (tmp_path / "runs").exists()


def test_bad_flag_value_is_one_line_and_creates_nothing(cli, tmp_path):
    r = cli("submit", "--instance", "local", "--strategy", "zero9", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: the command line: strategy (--strategy): unknown strategy 'zero9'; choose one of: auto, single, ddp, "
        "zero1, zero2, zero3, zero2-offload, zero3-offload, fsdp"
    ]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_submit_local_runs_the_offline_default_end_to_end(cli, tmp_path):
    r = cli(
        "submit",
        "--instance",
        "local",
        "--",
        "--max-steps",
        "40",
        "--log-every",
        "10",
        "--eval-every",
        "20",
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "", "WANDB_API_KEY": ""},
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (root,) = (tmp_path / "runs").iterdir()
    assert json.loads((root / "status.json").read_text())["status"] == "Completed"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (root / "model").iterdir()}
    losses = [
        json.loads(line)["train_loss"]
        for line in (root / "output" / "metrics.jsonl").read_text().splitlines()
        if "train_loss" in line
    ]
    assert losses[-1] < losses[0]
    assert "eval_accuracy=" in r.stdout
    # The closing line times the steps apart from the setup before them (a first DeepSpeed op build: minutes).
    assert re.search(r"^done: \d+ steps in \S+ of training, after \S+ of setup; ", r.stdout + r.stderr, re.M)
    assert list((root / "output" / "wandb").glob("offline-run-*"))
    # ls and status read the job back with no --backend: ls lists every backend (SageMaker, with no
    # credentials here, is noted and skipped); status follows the job's record, from any folder
    ls = cli(
        "ls", "--json", cwd=tmp_path, env={**os.environ, "AWS_ACCESS_KEY_ID": "", "AWS_EC2_METADATA_DISABLED": "true"}
    )
    assert [(j["job_name"], j["backend"]) for j in json.loads(ls.stdout)] == [(root.name, "local")]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    st = cli("status", root.name, "--json", cwd=elsewhere)
    assert (json.loads(st.stdout)["status"], json.loads(st.stdout)["backend"]) == ("Completed", "local")
    assert cli("wait", root.name, cwd=elsewhere).returncode == 0
    logs = cli("logs", root.name, "--json", cwd=elsewhere)
    records = [json.loads(line) for line in logs.stdout.splitlines()]  # every stdout line is JSON
    # one record per line of job.log (a progress bar's "\r" stays inside its line, as it was written)
    assert logs.returncode == 0 and len(records) == (root / "job.log").read_bytes().count(b"\n")
    assert {r["host"] for r in records} == {"local"} and all(r["time"] for r in records)  # when it was written
    assert any(r["message"].startswith("step=") and "eval_accuracy=" in r["message"] for r in records)


def test_resume_from_shares_the_earlier_jobs_checkpoints(tmp_path):
    earlier = tmp_path / "runs" / "first-job" / "checkpoints"
    with pytest.raises(UserError, match="--resume-from first-job: no checkpoints"):
        plan_job(local_spec(tmp_path, resume_from="first-job"))
    earlier.mkdir(parents=True)
    plan = plan_job(local_spec(tmp_path, resume_from="first-job"), dry_run=True)
    assert plan.request["env"]["DISTRAIN_CHECKPOINT_DIR"] == str(earlier.resolve())
    assert plan.request["env"]["DISTRAIN_MODEL_DIR"] != str(earlier.parent.resolve() / "model")


def test_resume_from_refuses_another_strategy_task_or_model_in_one_line(cli, tmp_path, job_records):
    first = cli("submit", "--instance", "local", "--dry-run", "--json", "--", "--task", "causal-lm", cwd=tmp_path)
    name = json.loads(first.stdout)["job_name"]
    # A recorded earlier job, as submit leaves it: its spec, its folder with checkpoints
    job_records.mkdir(parents=True, exist_ok=True)
    spec = {"train_args": ["--task", "causal-lm"], "local": {"workdir": "runs"}}
    (job_records / f"{name}.json").write_text(
        json.dumps({"name": name, "backend": "local", "workdir": str(tmp_path / "runs"), "spec": spec})
    )
    (tmp_path / "runs" / name / "checkpoints").mkdir(parents=True)
    new_task = ("--", "--task", "masked-lm", "--preset", "tiny-bert")
    cases = {
        ("--strategy", "zero2"): "that job trained strategy auto, this one asks for strategy zero2",
        new_task: "trained task causal-lm, this one asks for task masked-lm",
        ("--", "--preset", "tiny-bert"): "trained model preset tiny-gpt2, this one asks for model preset tiny-bert",
    }
    for extra, message in cases.items():
        r = cli("submit", "--instance", "local", "--resume-from", name, "--dry-run", *extra, cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"error: --resume-from {name}: ") and message in r.stderr
    # The earlier job's training flags come along; flags given again are added and shown
    r = cli("submit", "--instance", "local", "--resume-from", name, "--dry-run", "--", "--max-steps", "9", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "changed: training flags: + --max-steps 9" in r.stdout
    assert f"resumes: {name} (lineage {name}: " in r.stdout


def _submit(cli, tmp_path, env: dict[str, str], *args: str, ok: bool = True) -> tuple[str, dict[int, float]]:
    """`submit --instance local ARGS`, which succeeds (or, not `ok`, fails): the new job's name and
    its step -> train_loss."""
    before = set((tmp_path / "runs").iterdir()) if (tmp_path / "runs").exists() else set()
    r = cli("submit", "--instance", "local", *args, cwd=tmp_path, env=env, timeout=300)
    (root,) = set((tmp_path / "runs").iterdir()) - before
    assert (r.returncode == 0) == ok, r.stdout[-2000:] + r.stderr[-2000:]
    metrics = root / "output" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return root.name, {m["step"]: m["train_loss"] for m in records if "train_loss" in m}


@pytest.mark.slow
def test_resume_from_without_retyping_flags_gives_the_uninterrupted_losses(cli, tmp_path):
    """fsdp sharded inside the compiled graph (aot_eager: no Inductor build), 2 processes: job flags
    and training flags come along, each process resumes from its own shard file. This engine's
    resume after a kill -9 is proven here alone (test_graph_fsdp.py resumes it on another number of
    processes). A one-process ddp job killed and resumed the same way was a second case of this
    test: submit hands every engine the same flags and checkpoint folder, and the trainer's resume
    to the uninterrupted numbers is test_resume.py's, bit for bit, at every kill step."""
    job = ["--processes", "2", "--strategy", "fsdp"]
    flags = [*job, "--", "--task", "causal-lm", "--max-steps", "6", "--save-every", "2", "--log-every", "1"]
    flags += ["--eval-every", "100", "--report-to", "none", "--compile", "--compile-unit", "model"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTRAIN_COMPILE_BACKEND": "aot_eager"}

    whole, uninterrupted = _submit(cli, tmp_path, env, *flags)
    # GPT-2 ties its LM head to its embedding: saved as transformers saves it, Accelerate has nothing
    # to warn about at each of the three checkpoints.
    assert "Removed shared tensor" not in (tmp_path / "runs" / whole / "job.log").read_text()
    killed, first = _submit(cli, tmp_path, {**env, "DISTRAIN_TEST_KILL_AT_STEP": "3"}, *flags, ok=False)
    assert max(first) == 3
    resumed, rest = _submit(cli, tmp_path, env, "--resume-from", killed)  # no training flags retyped
    assert min(rest) == 3 and {**first, **rest} == uninterrupted
    # The same engine again, from each process's shard file, to the same weights bit for bit
    assert "fsdp_sharding=in-graph weights=" in (tmp_path / "runs" / resumed / "job.log").read_text()
    weights = lambda job: (tmp_path / "runs" / job / "model" / "model.safetensors").read_bytes()  # noqa: E731
    assert weights(resumed) == weights(whole)
    kept = sorted((tmp_path / "runs" / killed / "checkpoints").glob("checkpoint-*"))  # the lineage's folder
    assert [c.name for c in kept] == ["checkpoint-00000004", "checkpoint-00000006"]
    for ckpt in kept:
        assert sorted(p.name for p in ckpt.glob("graph_shards_*.pt")) == ["graph_shards_0.pt", "graph_shards_1.pt"]
    # Back on one GPU, its shards cut anew, is test_graph_fsdp's resume on another number of
    # processes (to the 2 processes' losses); a --processes given again reaching the resumed job
    # through submit is the test below. A fifth compiled job here proved nothing more.
    plan = json.loads((tmp_path / "runs" / resumed / "job.json").read_text())
    shared = str((tmp_path / "runs" / killed / "checkpoints").resolve())
    assert plan["request"]["env"]["DISTRAIN_CHECKPOINT_DIR"] == shared


@pytest.mark.slow
def test_a_completed_job_resumed_on_more_processes_keeps_its_global_batch(cli, tmp_path):
    flags = ["--", "--task", "causal-lm", "--max-steps", "6", "--save-every", "2", "--log-every", "1"]
    flags += ["--eval-every", "100", "--report-to", "none"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first, _ = _submit(cli, tmp_path, env, *flags)
    # GPT-2 ties its LM head to its embedding: saved as transformers saves it, Accelerate has nothing
    # to warn about at each of the three checkpoints.
    assert "Removed shared tensor" not in (tmp_path / "runs" / first / "job.log").read_text()
    # On 2 processes, the job's micro-batch of 16 would double its global batch: refused in one line
    # that names the flags that keep it, which then resume it.
    wider = ("--resume-from", first, "--processes", "2")
    r = cli("submit", "--instance", "local", *wider, "--", "--max-steps", "7", cwd=tmp_path, env=env, timeout=300)
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "was trained with a global batch of 16" in errors[0]
    assert "resume with --batch-size 8 --grad-accum 1" in errors[0]
    # The job completed its 6 steps: resumed, it trains on to a higher --max-steps.
    both, more = _submit(cli, tmp_path, env, *wider, "--", "--batch-size", "8", "--grad-accum", "1", "--max-steps", "7")
    log = (tmp_path / "runs" / both / "job.log").read_text()
    assert "resumed_from=checkpoint-00000006 step=6" in log and sorted(more) == [7], log[-2000:]
    plan = json.loads((tmp_path / "runs" / both / "job.json").read_text())
    shared = str((tmp_path / "runs" / first / "checkpoints").resolve())
    assert plan["request"]["env"]["DISTRAIN_CHECKPOINT_DIR"] == shared
    # The resumed job completed: `resume` as it was would train nothing, and is refused naming the way on,
    done = cli("resume", both, "--dry-run", cwd=tmp_path, env=env)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"error: {both} completed: every step it was asked for is trained. To train further, resume it with a "
        f"higher --max-steps: distrain-cloud submit --resume-from {both} -- --max-steps N"
    ]
    # which stays in the lineage: the first job's checkpoint folder.
    again = cli("submit", "--resume-from", both, "--dry-run", "--json", "--", "--max-steps", "9", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["request"]["env"]["DISTRAIN_CHECKPOINT_DIR"] == shared


def _start_cli(tmp_path, *train_flags: str) -> subprocess.Popen:
    """`distrain-cloud submit --instance local` in a session of its own, as in a terminal: the
    CLI's process group is the terminal's foreground group, which a Ctrl-C signals."""
    return subprocess.Popen(
        [sys.executable, "-m", "distrain_cloud.launcher.cli", "submit", "--instance", "local", "--", *train_flags],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "", "WANDB_API_KEY": "", "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, "the job ended before it was stopped:\n" + proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out waiting for the job"
        time.sleep(0.1)


def _job_root(tmp_path) -> Path | None:
    roots = list((tmp_path / "runs").glob("*/status.json")) if (tmp_path / "runs").is_dir() else []
    return roots[0].parent if roots else None


def _kill_everything(proc: subprocess.Popen, root: Path | None) -> None:
    """After a failed assertion: the CLI's group and the job's (it runs in a group of its own)."""
    groups = [proc.pid]
    if root is not None and "pid" in (info := json.loads((root / "status.json").read_text())):
        groups.append(info["pid"])
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate()


@pytest.mark.slow
# 2: data loader workers, as on GPUs by default. `cancel` from another shell stops it as Ctrl-C does.
@pytest.mark.parametrize("stop, workers", [("cancel", "0"), ("ctrl-c", "2")])
def test_ctrl_c_in_the_terminal_checkpoints_and_the_job_is_stopped(cli, tmp_path, stop, workers):
    flags = ["--max-steps", "100000", "--save-every", "1000", "--log-every", "1", "--num-workers", workers]
    proc = _start_cli(tmp_path, *flags)
    root = None
    try:

        def three_steps_logged() -> bool:
            nonlocal root
            root = _job_root(tmp_path)
            metrics = root / "output" / "metrics.jsonl" if root else None
            return metrics is not None and metrics.is_file() and metrics.read_text().count("\n") >= 3

        _wait_for(three_steps_logged, proc)
        assert root is not None
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        else:  # another shell: it returns once the job has stopped
            cancel = cli("cancel", root.name, cwd=tmp_path)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            _kill_everything(proc, root)
    assert root is not None
    sig = "SIGINT" if stop == "ctrl-c" else "SIGTERM"
    assert proc.returncode == 128 + signal.Signals[sig], out[-2000:] + err[-3000:]
    (stopped,) = [line for line in out.splitlines() if line.startswith("stopped=")]
    step = int(stopped.split()[1].removeprefix("step="))
    assert stopped == f"stopped={sig} step={step} checkpoint_saved=1"
    (ckpt,) = (root / "checkpoints").glob("checkpoint-*")
    assert ckpt.name == f"checkpoint-{step:08d}" and (ckpt / "COMPLETE").is_file()
    assert "Traceback" not in out + err, err[-3000:]
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert (status["status"], status["exit_code"]) == ("Stopped", 128 + signal.Signals[sig])
    assert f"--resume-from {root.name}" in status["detail"]
    assert "model in" not in err  # stopped: no model was saved
    # The last line names the command that continues it.
    assert err.strip().splitlines()[-1].endswith(f"; continue it: distrain-cloud resume {root.name}"), err[-2000:]
    if stop == "cancel":
        assert cancel.returncode == 0, cancel.stderr
        assert cancel.stdout == f"{root.name}: stopped ({status['detail']})\n"
        assert "(distrain-cloud cancel)" in status["detail"]
        assert cancel.stderr.startswith(f"stopping {root.name}: it saves a checkpoint at the end of this step")


def test_a_local_job_killed_hard_is_lost_not_in_progress(cli, tmp_path):
    # The whole job killed at once, the CLI that would record its end included (kill -9, a
    # closed terminal): status and ls must not say InProgress forever.
    proc = _start_cli(tmp_path, "--max-steps", "100000")
    root = None
    try:

        def started() -> bool:
            nonlocal root
            root = _job_root(tmp_path)
            return root is not None and "pid" in json.loads((root / "status.json").read_text() or "{}")

        _wait_for(started, proc, timeout=60)
        assert root is not None
        assert json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)["status"] == "InProgress"
    finally:
        _kill_everything(proc, root)
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert status["status"] == "Lost" and status["terminal"]
    assert "ended without recording an exit status" in status["detail"]
    ls = cli(
        "ls", "--json", cwd=tmp_path, env={**os.environ, "AWS_ACCESS_KEY_ID": "", "AWS_EC2_METADATA_DISABLED": "true"}
    )
    assert [j["status"] for j in json.loads(ls.stdout)] == ["Lost"]


@pytest.mark.slow  # starts a training job
@pytest.mark.parametrize(
    "flags, error",
    [
        # A Hub model with the Hub out of reach: the Hub client raises chained errors, and accelerate
        # launch and node_launch used to add theirs (and the CLI claimed a model that was never saved).
        # Now it fails at once, naming the fix.
        (
            ["--model", "gpt2"],
            "error: --model gpt2 is not in this machine's Hugging Face cache (*) and the Hub is out of reach "
            "(HF_HUB_OFFLINE is set): run `hf download gpt2 --local-dir gpt2` where the Hub is reachable and give "
            "--model the absolute path of gpt2 (or `hf download gpt2` into the HF_HOME this machine reads), or "
            "build the model from a config offline (--preset tiny-gpt2, --model-config FILE)",
        ),
        # A column the data does not have, found only once the data is read inside the job (a misspelt
        # config key, once found there too, is now a plan check: tests/launcher/test_typos.py).
        (
            ["--text-column", "sentence"],
            "error: --text-column 'sentence' is not in data builtin:sentiment; its columns are: *",
        ),
    ],
    ids=["hub-model-offline", "column-misspelt"],
)
def test_a_failure_inside_training_is_one_error_line_and_the_status_says_why(cli, tmp_path, flags, error):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "", "WANDB_API_KEY": ""}
    r = cli("submit", "--instance", "local", "--", *flags, "--report-to", "none", cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    output = (r.stdout + r.stderr).splitlines()
    errors = [line for line in output if line.startswith("error:")]
    assert len(errors) == 1 and fnmatch.fnmatchcase(errors[0], error), r.stdout[-2000:] + r.stderr[-3000:]
    assert not any("Traceback" in line or "CalledProcessError" in line for line in output)
    assert "model in" not in r.stderr
    (root,) = (tmp_path / "runs").iterdir()
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert (status["status"], status["exit_code"]) == ("Failed", 2)
    assert status["detail"] == errors[0].removeprefix("error: ")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_step_lines_redraw_one_status_line_and_logs_scroll_above_it():
    from distrain_cloud.launcher.backends.local import TerminalProgress

    step = (
        "step={n} train_loss=1.5 lr=0.001 tokens_per_sec=15620.4 step_time=0.01 data_wait_pct=1 "
        "progress={n}/40 elapsed=3s eta=9s time=2026-11-26T14:00:00Z\n"
    )
    term = _Terminal()
    shown = TerminalProgress(term)
    for line in ["compile=off\n", step.format(n=10), step.format(n=20), "step=20 eval_loss=1.4\n", step.format(n=30)]:
        shown.write(line.encode())
    shown.close()
    status = "step {n}/40 | loss 1.5 | 15,620 tokens/s | elapsed 3s | ETA 9s"
    assert term.getvalue() == (
        "compile=off\n"
        f"\r\x1b[K[#####...............] {status.format(n=10)}"
        f"\r\x1b[K[##########..........] {status.format(n=20)}"
        "\r\x1b[Kstep=20 eval_loss=1.4\n"
        f"\r\x1b[K[###############.....] {status.format(n=30)}\n"
    )
    # Not a terminal (a pipe, a CI log): every line as it came.
    piped = io.StringIO()
    plain = TerminalProgress(piped)
    plain.write(step.format(n=10).encode())
    plain.close()
    assert piped.getvalue() == step.format(n=10)


@pytest.mark.slow  # starts a training job
def test_an_unforeseen_failure_is_one_line_with_its_traceback_in_a_file(cli, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DISTRAIN_TEST_RAISE_AT_STEP": "2"}
    r = cli("submit", "--instance", "local", "--", "--max-steps", "5", "--report-to", "none", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    (root,) = (tmp_path / "runs").iterdir()
    traceback_file = root / "output" / "traceback.txt"
    output = (r.stdout + r.stderr).splitlines()
    assert [line for line in output if line.startswith("error:")] == [
        f"error: RuntimeError: injected failure at step 2 (traceback in {traceback_file}; DISTRAIN_DEBUG=1 prints it)"
    ]
    assert not any("Traceback" in line for line in output)
    assert "in after_step" in traceback_file.read_text()  # nothing lost: the whole traceback
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert (status["status"], status["exit_code"]) == ("Failed", 1)
    assert status["detail"].startswith("RuntimeError: injected failure at step 2")


@pytest.mark.slow
def test_a_job_whose_cli_is_killed_does_not_run_on(cli, tmp_path):
    """The job leads a process group of its own (a terminal's Ctrl-C reaches the CLI alone); a CLI
    killed outright (kill -9, the OOM killer) left it training with nobody to stop it or read its
    output. Now its node launcher gets SIGTERM when the CLI dies: every process of the job ends
    within the stop's bound."""
    from distrain_cloud.training.stopping import ProcessTree

    # A checkpoint a step shows progress. The job writes its own log: lines come as they are printed
    # (`logs` from another shell shows them), and the log is whole after its CLI was killed.
    flags = ["--max-steps", "100000", "--save-every", "1", "--log-every", "1", "--stop-grace", "10"]
    proc = _start_cli(tmp_path, *flags)
    root, job, follow = None, None, None
    try:

        def training() -> bool:
            nonlocal root
            root = _job_root(tmp_path)
            return root is not None and any((root / "checkpoints").glob("checkpoint-*/COMPLETE"))

        _wait_for(training, proc)
        assert root is not None
        job = ProcessTree(json.loads((root / "status.json").read_text())["pid"])
        job.refresh()  # node_launch, accelerate's launcher, the trainer
        assert len(job.alive()) >= 3, job.seen
        logs = cli("logs", root.name, cwd=tmp_path)  # another shell, while it runs
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout.startswith("node_launch node_rank=0") and "\nstep=" in logs.stdout
        follow = subprocess.Popen(
            [sys.executable, "-m", "distrain_cloud.launcher.cli", "logs", root.name, "--follow", "--json"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1)  # inside its loop before the job ends
        os.kill(proc.pid, signal.SIGKILL)  # the CLI alone
        proc.communicate(timeout=30)
        gone = job.wait_gone(10 + 20)  # --stop-grace and the launchers' margins
        left = job.alive()
        followed, follow_err = follow.communicate(timeout=30)  # it ends with the job
    finally:
        if proc.poll() is None:
            _kill_everything(proc, root)
        if job is not None:
            job.kill()  # what a failed assertion (or today's code) left running
        if follow is not None and follow.poll() is None:
            follow.kill()
    assert gone, f"the job's processes outlived its CLI: {left}"
    # Its end is known, not Lost: the node launcher recorded it, and each line has its time.
    assert follow.returncode == 0, follow_err
    records = [json.loads(line) for line in followed.splitlines()]
    assert records and all(r["time"] and r["host"] == "local" for r in records), records[:3]
    (stopped,) = [r["message"] for r in records if r["message"].startswith("stopped=")]
    assert stopped.startswith("stopped=SIGTERM step=") and stopped.endswith(" checkpoint_saved=1")
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert (status["status"], status["exit_code"]) == ("Stopped", 143), status
    assert f"resume with --resume-from {root.name}" in status["detail"]


def test_cancel_now_from_another_shell_kills_the_job_at_once(cli, tmp_path):
    proc = _start_cli(tmp_path, "--max-steps", "100000")
    root = None
    try:

        def started() -> bool:
            nonlocal root
            root = _job_root(tmp_path)
            return root is not None and "pid" in json.loads((root / "status.json").read_text() or "{}")

        _wait_for(started, proc, timeout=60)
        assert root is not None
        job = ProcessTree(json.loads((root / "status.json").read_text())["pid"])
        cancel = cli("cancel", root.name, "--now", cwd=tmp_path)
        out, err = proc.communicate(timeout=30)
    finally:
        _kill_everything(proc, root)
    assert not job.alive()
    assert proc.returncode == 137, err[-3000:]
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert (status["status"], status["exit_code"]) == ("Stopped", 137)
    assert status["detail"] == (
        "cancelled at once (cancel --now), no checkpoint of the step in progress; "
        f"resume with --resume-from {root.name}"
    )
    assert (cancel.returncode, cancel.stdout) == (0, f"{root.name}: stopped ({status['detail']})\n"), cancel.stderr


@pytest.mark.slow  # starts a training job
def test_a_training_process_the_oom_killer_ends_is_one_line_naming_it_and_the_resume(cli, tmp_path):
    # The out-of-memory killer's SIGKILL, to the trainer alone: accelerate's launcher used to add
    # its traceback and the job said only "exit code 1".
    from distrain_cloud.training.node_launch import _training_processes

    proc = _start_cli(tmp_path, "--max-steps", "100000")
    root, trainers = None, []
    try:

        def trainer_started() -> bool:  # the launcher's report is the same at any step: no need to train
            nonlocal root, trainers
            root = _job_root(tmp_path)
            info = json.loads((root / "status.json").read_text() or "{}") if root else {}
            trainers = _training_processes(info["pid"]) if "pid" in info else []
            return bool(trainers)

        _wait_for(trainer_started, proc, timeout=60)
        assert root is not None and len(trainers) == 1
        os.kill(trainers[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            _kill_everything(proc, root)
    assert root is not None
    line = (
        "error: a training process was killed by SIGKILL: likely the out-of-memory killer (the machine ran out of "
        "memory: a smaller --batch-size or --block-size, or fewer --processes, needs less); resume from "
        f"the last checkpoint with `distrain-cloud resume {root.name}`"
    )
    output = (out + err).splitlines()
    assert [x for x in output if x.startswith("error:")] == [line], err[-3000:]
    assert not any("Traceback" in x or "CalledProcessError" in x for x in output), err[-3000:]
    assert proc.returncode == 137
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert (status["status"], status["exit_code"], status["detail"]) == ("Failed", 137, line.removeprefix("error: "))


def _running_job(runs: Path, pid: int, **status) -> Path:
    """A local job's folder whose status.json says pid `pid` runs it (anyone may write that file)."""
    import socket

    root = runs / "job-1"
    root.mkdir(parents=True)
    (root / "job.json").write_text("{}")
    record = {"status": "InProgress", "exit_code": None, "pid": pid, "host": socket.gethostname(), **status}
    (root / "status.json").write_text(json.dumps(record))
    return root


def test_cancel_signals_no_process_that_is_not_the_jobs(tmp_path, capsys):
    # status.json is only a file, and pids are reused: cancel checks that the pid it names is the
    # job's own process (started when it was, in the job's folder) before it signals anything.
    from clirun import run_cli

    from distrain_cloud.training.stopping import _start_time

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    try:
        runs = tmp_path / "runs"
        root = _running_job(runs, bystander.pid)
        code, out, err = run_cli(capsys, "cancel", "job-1", "--workdir", str(runs))
        assert code != 0 and out == "", err
        assert err == (
            f"error: job-1: its status.json names pid {bystander.pid}, a process that runs elsewhere, not in this "
            "job's folder: nothing was signalled\n"
        )
        # The same pid, recorded with another start time: a later process that reuses it.
        started = _start_time(bystander.pid)
        record = json.loads((root / "status.json").read_text()) | {"started": started + 1}
        (root / "status.json").write_text(json.dumps(record))
        code, out, err = run_cli(capsys, "cancel", "job-1", "--now", "--workdir", str(runs))
        assert code != 0 and "a later process reusing that pid: nothing was signalled" in err
        assert bystander.poll() is None  # neither cancel touched it
        (root / "status.json").write_text(json.dumps({"status": "Completed", "exit_code": 0}))
        code, out, err = run_cli(capsys, "cancel", "job-1", "--workdir", str(runs))
        assert (code, out, err) == (0, "job-1 already ended: Completed\n", "")
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize(
    "left, status, exit_code, detail",
    [
        # its node launcher's record: stopped by the SIGTERM the CLI's death sends, checkpoint saved
        ({"exit.json": '{"exit_code": 143, "stopped": 15}'}, "Stopped", 143, "stopped on request (Ctrl-C or SIGTERM)"),
        ({"exit.json": '{"exit_code": 0, "stopped": null}'}, "Completed", 0, ""),
        # `cancel --now` killed it, node launcher included: no record but the cancel's
        ({"cancel.json": '{"now": true}'}, "Stopped", 137, "cancelled at once (cancel --now)"),
        # a record that is not node_launch's (hand-made, cut short): nothing known
        ({"exit.json": '{"exit_code": "143"}'}, "Lost", None, "ended without recording an exit status"),
        ({"exit.json": "[" * 100_000}, "Lost", None, "ended without recording an exit status"),
    ],
    ids=["stopped", "completed", "cancel-now", "not-a-record", "deep-json"],
)
def test_a_job_that_ended_with_nobody_to_record_it_is_what_its_launcher_recorded(
    tmp_path, capsys, left, status, exit_code, detail
):
    from clirun import run_cli

    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()  # a pid that no longer runs, as the job's once its CLI is gone
    runs = tmp_path / "runs"
    root = _running_job(runs, ended.pid)
    for name, text in left.items():
        (root / name).write_text(text)
    code, out, err = run_cli(capsys, "status", "job-1", "--workdir", str(runs), "--json")
    assert (code, err) == (0, ""), err
    info = json.loads(out)
    assert (info["status"], info["exit_code"]) == (status, exit_code)
    assert detail in info["detail"]
