"""`distrain-cloud push JOB`: a failed push retried alone from the model a local job kept, against
a local double of the Hub's HTTP API (tests/hubdouble.py); and a `resume` that would train again
from step 1 (no checkpoint) is refused, naming the push instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run_cli
from hubdouble import HubDouble

from distrain_cloud.infra.errors import UserError

FAKE_TOKEN = "hf_test_not_a_real_token_456"


@pytest.fixture
def hub(monkeypatch, job_records, tmp_path):
    import huggingface_hub.constants as hf_constants

    with HubDouble() as double:
        monkeypatch.setenv("HF_ENDPOINT", double.url)
        monkeypatch.setattr(hf_constants, "ENDPOINT", double.url)  # read once at import, as in test_hub.py
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
        monkeypatch.chdir(tmp_path)
        yield double


def local_job(runs: Path, name: str = "job-1", status: str = "Failed", *, model: bool = True, **asked) -> Path:
    """A local job's folder as training leaves it after a failed push: plan, status, whole model."""
    root = runs / name
    root.mkdir(parents=True)
    (root / "job.json").write_text("{}")
    (root / "status.json").write_text(json.dumps({"status": status, "exit_code": 1}))
    if model:
        folder = root / "model"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
        (folder / "model.safetensors").write_bytes(b"\0" * 2048)
        (folder / "training_args.json").write_text(json.dumps({"push_to_hub": "me/tiny", "hub_private": True, **asked}))
        (folder / "README.md").write_text("---\ntags: [distrain-cloud]\n---\n# tiny\n")
    return root


def test_push_retries_the_push_alone_from_the_kept_model(hub, tmp_path, capsys):
    root = local_job(tmp_path / "runs", hub_revision="exp")
    code, out, err = run_cli(capsys, "push", "job-1")
    assert code == 0, err
    files = hub.files("me/tiny", branch="exp")  # the job's --hub-revision, from training_args.json
    for name in ("config.json", "model.safetensors", "training_args.json", "README.md"):
        assert files[name] == (root / "model" / name).read_bytes(), name
    assert hub.repo("me/tiny").private  # the job's --hub-private
    head = hub.repo("me/tiny").branches["exp"].head
    assert out == f"pushed {root / 'model'} to the Hub repo me/tiny (branch exp): {hub.url}/me/tiny/commit/{head}\n"
    # Another repo and branch on request; the token only ever in the Authorization header.
    code, out, err = run_cli(capsys, "push", "job-1", "--repo", "me/other", "--revision", "main")
    assert code == 0 and " to the Hub repo me/other: " in out, err
    assert all(FAKE_TOKEN not in r.path + r.body.decode(errors="replace") for r in hub.requests)


def test_a_push_that_fails_again_is_one_line_naming_the_retry_without_the_token(hub, tmp_path, capsys):
    local_job(tmp_path / "runs")
    hub.fail["commit"] = (403, f"You don't have the rights to create a model under this namespace ({FAKE_TOKEN})")
    code, out, err = run_cli(capsys, "push", "job-1")
    assert code != 0 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: Pushing ") and "to the Hub repo me/tiny failed: " in line, line
    assert line.endswith("; run `distrain-cloud push job-1` again once that is fixed"), line
    assert FAKE_TOKEN not in err


@pytest.mark.parametrize(
    "setup, argv, expected",
    [
        (dict(model=False), [], "job-1 kept no whole model in "),
        (dict(push_to_hub=None), [], "job-1 was not asked to push to the Hub: name the repo with --repo REPO"),
        (dict(push_to_hub=["x"]), [], "was not asked to push to the Hub"),  # a hostile file: not a repo
        (dict(), ["--repo", "bad id!!"], "--repo 'bad id!!' is not a Hub repo id: a repo id is NAME or"),
        (dict(hub_revision="a..b"), [], "the job's --hub-revision 'a..b': a branch is letters, digits"),
        (dict(push_to_hub="x y"), [], "the job's --push-to-hub 'x y' is not a Hub repo id"),  # an edited file
    ],
    ids=["no-model", "no-repo", "not-a-string", "bad-repo", "bad-branch", "bad-recorded-repo"],
)
def test_what_cannot_be_pushed_is_one_line_and_sends_nothing(hub, tmp_path, capsys, setup, argv, expected):
    local_job(tmp_path / "runs", **setup)
    code, out, err = run_cli(capsys, "push", "job-1", *argv)
    assert code == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1, err
    assert hub.requests == []


def test_push_without_a_token_says_how_to_give_one(hub, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no `hf auth login` token here
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    local_job(tmp_path / "runs")
    code, _, err = run_cli(capsys, "push", "job-1")
    assert code == 2 and "set HF_TOKEN in this environment or log in with `hf auth login`" in err, err
    assert hub.requests == []


def test_push_takes_the_jobs_own_secret_reference_then_a_stored_login(hub, tmp_path, capsys, monkeypatch, job_records):
    import huggingface_hub

    from distrain_cloud.infra import secret_env

    monkeypatch.delenv("HF_TOKEN")
    local_job(tmp_path / "runs")
    ref = "ssm:/distrain-cloud/hf-token"  # as `submit --secret HF_TOKEN=REF` records it
    record = {"name": "job-1", "backend": "local", "workdir": str(tmp_path / "runs")}
    job_records.mkdir(parents=True, exist_ok=True)
    (job_records / "job-1.json").write_text(json.dumps({**record, "spec": {"secrets": {"HF_TOKEN": ref}}}))
    resolved: list[tuple[str, str]] = []

    def resolve(reference, name, client_factory=None):
        resolved.append((reference, name))
        return FAKE_TOKEN

    monkeypatch.setattr(secret_env, "resolve", resolve)
    code, _, err = run_cli(capsys, "push", "job-1")
    assert code == 0 and resolved == [(ref, "HF_TOKEN")], err
    assert hub.requests[-1].header("authorization") == f"Bearer {FAKE_TOKEN}"

    def unresolvable(reference, name, client_factory=None):
        raise UserError(f"cannot resolve {name} from {reference}: no AWS credentials")

    monkeypatch.setattr(secret_env, "resolve", unresolvable)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_stored_login_789")  # `hf auth login`'s
    code, _, err = run_cli(capsys, "push", "job-1")
    assert code == 0, err
    assert hub.requests[-1].header("authorization") == "Bearer hf_stored_login_789"
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    code, _, err = run_cli(capsys, "push", "job-1")
    assert code == 2 and err.strip().endswith(
        f"or log in with `hf auth login` (cannot resolve HF_TOKEN from {ref}: no AWS credentials)"
    ), err


def test_push_of_a_cloud_job_says_plainly_it_is_local_only(hub, capsys, aws_calls):
    code, _, err = run_cli(capsys, "push", "job-1", "--backend", "sagemaker", "--region", "us-east-1")
    assert code == 2 and err.startswith("error: job-1 is a sagemaker job: `distrain-cloud push` retries local jobs")
    assert hub.requests == [] and aws_calls == []


def test_resume_of_a_job_that_trained_and_failed_to_push_is_refused_naming_the_push(hub, tmp_path, capsys):
    # A job whose push failed after training: resume used to train it again (from step 0 without a checkpoint).
    root = local_job(tmp_path / "runs")
    code, out, err = run_cli(capsys, "resume", "job-1", "--dry-run")
    assert (code, out) == (2, ""), err
    assert err.strip() == (
        f"error: job-1 trained every step and saved its model in {(root / 'model').resolve()}: what failed came "
        "after (its push to the Hub: `distrain-cloud push job-1` retries only that). To train further, resume it "
        "with a higher --max-steps: distrain-cloud submit --resume-from job-1 -- --max-steps N"
    )


def test_resume_with_no_checkpoint_is_refused_not_trained_again_from_step_1(hub, tmp_path, capsys):
    local_job(tmp_path / "runs", model=False)  # failed before it saved anything
    code, out, err = run_cli(capsys, "resume", "job-1", "--dry-run")
    checkpoints = (tmp_path / "runs" / "job-1" / "checkpoints").resolve()
    assert (code, out) == (2, ""), err
    assert err.strip() == (
        f"error: job-1 has no checkpoint to resume from in {checkpoints} (it saved none): a resume would train "
        "again from step 1; to train afresh, submit its spec again (without --resume-from job-1)"
    )
