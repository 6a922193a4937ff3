"""`--push-to-hub`: training/hub.py against a local double of the Hub HTTP API."""

from __future__ import annotations

import json
import logging
import re
import traceback
from pathlib import Path

import pytest
from hubdouble import HubDouble  # tests/ is on pytest's pythonpath (pyproject.toml)

from distrain_cloud.training.hub import HubPushError, push_to_hub  # noqa: E402

# Fake, and short enough that no secret scanner takes it for a real token.
FAKE_TOKEN = "hf_test_not_a_real_token_123"
REPO_ID = "distrain-tests/tiny-model"
NO_TOKEN_MESSAGE = (
    "--push-to-hub REPO needs a Hugging Face token in HF_TOKEN at run time"
    " (the launcher resolves it from a secret reference)"
)


@pytest.fixture
def hub(monkeypatch):
    """The double, reached the way a job reaches a Hub: through HF_ENDPOINT."""
    import huggingface_hub.constants as hf_constants

    with HubDouble() as double:
        monkeypatch.setenv("HF_ENDPOINT", double.url)
        # huggingface_hub reads HF_ENDPOINT once, when it is imported (as it is in a job,
        # whose environment is set before the process starts); here it is imported already.
        monkeypatch.setattr(hf_constants, "ENDPOINT", double.url)
        # Only the local double is ever reached, even where CI sets HF_HUB_OFFLINE.
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        # With telemetry on, the first request of a process is preceded by an anonymous
        # GET {ENDPOINT}/api/agent-harnesses (cached in HF_HOME): which test sees it would
        # depend on test order, and a successful answer would be written to the real HF_HOME.
        monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
        yield double


@pytest.fixture
def model_folder(tmp_path) -> Path:
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    # ~100 KB: big enough to be an LFS/Xet file on the real Hub, which decides by extension.
    save_file({"wte.weight": torch.randn(160, 160)}, str(folder / "model.safetensors"))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    # A model card, as Trainer writes one: huggingface_hub validates its metadata first.
    (folder / "README.md").write_text("---\nlicense: apache-2.0\ntags: [distrain-cloud]\n---\n# tiny\n")
    nested = folder / "runs" / "final"
    nested.mkdir(parents=True)
    (nested / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    return folder


def local_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("xet", [True, False], ids=["hf_xet-installed", "hf_xet-disabled"])
def test_push_uploads_every_file_byte_identical(hub, model_folder, monkeypatch, xet):
    import huggingface_hub.constants as hf_constants

    # upload_folder takes a different path (pipelined, then plain create_commit) without hf_xet.
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", not xet)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)  # read at call time, not at import

    commit_url = push_to_hub(model_folder, REPO_ID, commit_message="Final model")

    create = [r for r in hub.requests if r.path == "/api/repos/create"]
    assert len(create) == 1
    assert create[0].json() == {"name": "tiny-model", "organization": "distrain-tests", "type": "model"}

    repo = hub.repo(REPO_ID)
    assert hub.files(REPO_ID) == local_files(model_folder)
    assert set(repo.files) == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "README.md",
        "runs/final/trainer_state.json",
    }
    assert [c.summary for c in repo.commits] == ["Final model"]
    assert commit_url == f"{hub.url}/{REPO_ID}/commit/{repo.head}"
    assert hub.unhandled == []


def test_token_is_only_ever_sent_in_the_authorization_header(hub, model_folder, monkeypatch, caplog, capfd):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    # Most verbose: huggingface_hub then also logs every request as a curl command.
    monkeypatch.setattr(hf_constants, "HF_DEBUG", True)
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="huggingface_hub")

    commit_url = push_to_hub(model_folder, REPO_ID, private=True)

    assert hub.repo(REPO_ID).private
    assert len(hub.requests) >= 3  # create, preupload, commit at least
    for request in hub.requests:
        assert request.header("Authorization") == f"Bearer {FAKE_TOKEN}", request.path
        others = [(k, v) for k, v in request.headers if k.lower() != "authorization"]
        assert not [k for k, v in others if FAKE_TOKEN in v], request.path
        assert FAKE_TOKEN not in request.path
        assert FAKE_TOKEN.encode() not in request.body, request.path
    assert not [p for p, content in hub.files(REPO_ID).items() if FAKE_TOKEN.encode() in content]
    assert FAKE_TOKEN not in commit_url

    # The log checks below are only worth something if the logs were really captured.
    assert any(r.name.startswith("huggingface_hub") for r in caplog.records)
    assert FAKE_TOKEN not in caplog.text
    out, err = capfd.readouterr()
    assert FAKE_TOKEN not in out and FAKE_TOKEN not in err


def test_hub_errors_are_raised_without_the_token(hub, model_folder):
    # A server (or proxy) that echoes the credentials back in its error message.
    hub.fail["commit"] = (403, f"Bearer {FAKE_TOKEN} cannot write to {REPO_ID}")

    with pytest.raises(HubPushError) as caught:
        push_to_hub(model_folder, REPO_ID, token=FAKE_TOKEN, endpoint=hub.url)

    error = caught.value
    assert "403" in str(error) and "Bearer *** cannot write" in str(error)
    assert error.__cause__ is None and error.__context__ is None
    assert FAKE_TOKEN not in "".join(traceback.format_exception(error))
    assert any(r.path.startswith(f"/api/models/{REPO_ID}/commit/") for r in hub.requests)


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_no_token_fails_before_any_request(hub, model_folder, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    else:
        monkeypatch.setenv("HF_TOKEN", value)

    with pytest.raises(RuntimeError, match=re.escape(NO_TOKEN_MESSAGE)):
        push_to_hub(model_folder, REPO_ID)

    assert hub.requests == []
    assert hub.repos == {}


def test_a_revision_is_pushed_to_its_branch_created_from_main(hub, model_folder, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    push_to_hub(model_folder, REPO_ID, commit_message="First model")
    published = hub.files(REPO_ID)
    (model_folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 4}))

    commit_url = push_to_hub(model_folder, REPO_ID, revision="exp/lr-3e-4", commit_message="Experiment")

    repo = hub.repo(REPO_ID)
    assert hub.files(REPO_ID) == published  # main keeps the published model
    assert hub.files(REPO_ID, branch="exp/lr-3e-4") == local_files(model_folder)
    branch = repo.branches["exp/lr-3e-4"]
    # Created from main's head: the branch's history starts with main's commit.
    assert [c.summary for c in branch.commits] == ["First model", "Experiment"]
    assert commit_url == f"{hub.url}/{REPO_ID}/commit/{branch.head}"
    created = [r for r in hub.requests if r.path == f"/api/models/{REPO_ID}/branch/exp%2Flr-3e-4"]
    assert len(created) == 1 and created[0].json() == {}  # no startingPoint: main's head
    commits = [r.path for r in hub.requests if "/commit/" in r.path]
    assert commits == [f"/api/models/{REPO_ID}/commit/main", f"/api/models/{REPO_ID}/commit/exp%2Flr-3e-4"]
    assert hub.unhandled == []


def test_a_push_to_a_branch_that_exists_adds_a_commit_to_it(hub, model_folder, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    push_to_hub(model_folder, REPO_ID, revision="v2", commit_message="One")
    (model_folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 4}))

    push_to_hub(model_folder, REPO_ID, revision="v2", commit_message="Two")

    repo = hub.repo(REPO_ID)
    assert [c.summary for c in repo.branches["v2"].commits] == ["One", "Two"]
    assert repo.files == {}  # nothing went to main
    assert hub.files(REPO_ID, branch="v2") == local_files(model_folder)


def test_main_as_the_revision_creates_no_branch(hub, model_folder, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    push_to_hub(model_folder, REPO_ID, revision="main")
    assert not [r for r in hub.requests if "/branch/" in r.path]
    assert set(hub.repo(REPO_ID).branches) == {"main"} and hub.files(REPO_ID) == local_files(model_folder)


def test_a_branch_failure_names_the_branch_without_the_token(hub, model_folder, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    hub.fail["branch"] = (403, f"Bearer {FAKE_TOKEN} may not create branches")
    with pytest.raises(HubPushError, match=r"tiny-model \(branch v2\) failed: .*Bearer \*\*\* may not"):
        push_to_hub(model_folder, REPO_ID, revision="v2")
    assert not [r for r in hub.requests if "/commit/" in r.path]  # nothing was committed anywhere


@pytest.mark.slow  # trains a tiny model (seconds)
def test_a_failed_push_keeps_the_model_names_the_retry_and_the_retry_pushes_it(hub, train, monkeypatch):
    """The push fails after the whole run: the error line says the model is kept and names
    `distrain-cloud push JOB`, which then pushes that model without retraining."""
    from distrain_cloud.launcher.plan import JobRef
    from distrain_cloud.launcher.push import push_job

    hub.fail["commit"] = (403, "You don't have the rights to create a model under the namespace me")
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": FAKE_TOKEN,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DISTRAIN_INSTANCE_TYPE": "local",  # as the local backend sets them
        "DISTRAIN_JOB_NAME": "push-fails",
    }
    flags = ["--max-steps", "2", "--report-to", "none", "--generate-tokens", "0", "--push-to-hub", "me/tiny"]
    run = train(*flags, name="push-fails", env=env)
    model_dir = run.contract.model_dir
    assert run.returncode == 1, run.describe()
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: Pushing {model_dir} to the Hub repo me/tiny failed: "), line
    assert line.endswith(
        f"; the model is kept in {model_dir}: `distrain-cloud push push-fails` retries the push alone, without "
        "retraining"
    ), line
    assert (run.contract.output_dir / "failure").read_text() == line + "\n"
    assert FAKE_TOKEN not in run.stdout + run.stderr
    del hub.fail["commit"]
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    said = push_job(JobRef("push-fails", "local", workdir=run.contract.root.parent))
    assert said.startswith(f"pushed {model_dir} to the Hub repo me/tiny: "), said
    files = hub.files("me/tiny")
    for name in ("config.json", "model.safetensors", "training_args.json", "README.md"):
        assert files[name] == (model_dir / name).read_bytes(), name


def test_a_cloud_jobs_failed_push_names_hf_upload_not_the_local_retry(tmp_path):
    from distrain_cloud.training.hub import kept_model_line

    line = kept_model_line("me/tiny", tmp_path / "model", {"TRAINING_JOB_NAME": "sm-job"})
    assert line == (
        f"the model was saved in {tmp_path / 'model'} on the node; push it from a copy of that folder with "
        "`hf upload me/tiny FOLDER` (`distrain-cloud push` retries local jobs only)"
    )


def test_a_resume_that_finds_no_checkpoint_says_it_trains_from_step_1(tmp_path):
    from distrain_cloud.training.trainer import _nothing_resumed

    resumed = {"DISTRAIN_LINEAGE": "first", "DISTRAIN_JOB_NAME": "second"}
    assert _nothing_resumed(resumed, tmp_path) == (
        f"note: this job resumes lineage first, but its checkpoints ({tmp_path}) hold none: training starts "
        "again from step 1"
    )
    assert _nothing_resumed({"DISTRAIN_LINEAGE": "first", "TRAINING_JOB_NAME": "first"}, tmp_path) is None
    assert _nothing_resumed({}, tmp_path) is None  # run by hand: no lineage to speak of
