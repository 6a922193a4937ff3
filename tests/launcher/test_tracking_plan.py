"""What every backend tells a job's W&B run (lineage, instance, image, run id), the run's URL the
launcher names at submit, and the Hub settings the spec owns (--hub-revision, --hub-private).

Plans only: fake credentials, and any AWS call refused (the `no_calls` fixture).
"""

from __future__ import annotations

import json

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import api
from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.backends import local
from distrain_cloud.launcher.cli import main
from distrain_cloud.launcher.spec import load_spec
from distrain_cloud.launcher.tracking import tracking_env, wandb_run
from distrain_cloud.training.args import parse_args

ROLE = "arn:aws:iam::123456789012:role/distrain-sm"
HF_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"
WANDB_REF = "ssm:/distrain-cloud/wandb-key"
CLOUD = {"region": "us-east-1", "sagemaker.role": ROLE}


@pytest.fixture(autouse=True)
def no_calls(aws_calls, monkeypatch):
    """No W&B key or mode of the developer's, and no AWS call: plans make none."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    yield aws_calls
    assert aws_calls == [], f"planning made AWS calls: {aws_calls}"


def dry(tmp_path, **overrides):
    base = {"local.workdir": str(tmp_path / "runs")} if overrides.get("instance", "local") == "local" else CLOUD
    return plan_job(load_spec(None, {**base, **overrides}), dry_run=True)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as end:
        main(argv)
    out, err = capsys.readouterr()
    return int(end.value.code or 0), out, err


# ---------------------------------------------------------------- the variables, on every backend


def test_a_local_job_names_its_lineage_and_the_local_instance(tmp_path):
    plan = dry(tmp_path)
    env = plan.request["env"]
    assert env["DISTRAIN_LINEAGE"] == env["DISTRAIN_WANDB_RUN_ID"] == plan.job_name
    assert env["DISTRAIN_INSTANCE_TYPE"] == "local" and "DISTRAIN_IMAGE_URI" not in env


def test_a_resumed_local_jobs_lineage_is_the_first_job_of_the_chain(tmp_path):
    first = dry(tmp_path)
    root = tmp_path / "runs" / first.job_name
    (root / "checkpoints").mkdir(parents=True)
    (root / "job.json").write_text(first.to_json())
    second = dry(tmp_path, resume_from=first.job_name)
    (tmp_path / "runs" / second.job_name).mkdir()
    (tmp_path / "runs" / second.job_name / "job.json").write_text(second.to_json())
    third = dry(tmp_path, resume_from=second.job_name)  # a resume of a resume
    for plan in (second, third):
        assert plan.request["env"]["DISTRAIN_LINEAGE"] == first.job_name
        assert plan.request["env"]["DISTRAIN_WANDB_RUN_ID"] == first.job_name  # one W&B run per lineage


def test_a_sagemaker_job_names_its_lineage_instance_and_image_within_the_api_model(tmp_path):
    plan = dry(tmp_path, instance="ml.g5.xlarge")  # planning validates the request against the API model
    env = plan.request["Environment"]
    assert env["DISTRAIN_LINEAGE"] == env["DISTRAIN_WANDB_RUN_ID"] == plan.job_name
    assert env["DISTRAIN_INSTANCE_TYPE"] == "ml.g5.xlarge"
    assert env["DISTRAIN_IMAGE_URI"] == plan.request["AlgorithmSpecification"]["TrainingImage"]
    assert plan.summary["lineage"] == plan.job_name
    resumed = dry(tmp_path, instance="ml.g5.xlarge", resume_from="first-20250101-000000-abcdef")
    # Offline, the job it resumes stands for the lineage; at submit, that job's own lineage does.
    assert resumed.request["Environment"]["DISTRAIN_LINEAGE"] == "first-20250101-000000-abcdef"


def test_a_sagemaker_resume_takes_the_lineage_the_resumed_job_was_given(monkeypatch):
    from distrain_cloud.launcher.backends.sagemaker import backend as sm

    described = {
        "CheckpointConfig": {"S3Uri": "s3://b/distrain-cloud/checkpoints/first-job/"},
        "Environment": {"DISTRAIN_LINEAGE": "first-job"},
    }

    class Client:
        def describe_training_job(self, TrainingJobName):
            return described

    monkeypatch.setattr("distrain_cloud.infra.aws.client", lambda service, region, **_: Client())
    checks: list = []
    assert sm._previous_checkpoints("second-job", "us-east-1", checks) == (
        described["CheckpointConfig"]["S3Uri"],
        "first-job",
    )
    described.pop("Environment")  # a job submitted before jobs named their lineage: its own
    assert sm._previous_checkpoints("second-job", "us-east-1", checks)[1] == "second-job"


def test_an_ec2_jobs_nodes_pass_its_lineage_and_instance_to_training(tmp_path):
    plan = dry(tmp_path, instance="g4dn.12xlarge")
    env = plan.configs["job.json"]["env"]
    assert env == tracking_env(lineage=plan.job_name, instance="g4dn.12xlarge")
    assert env["DISTRAIN_WANDB_RUN_ID"] == plan.job_name and "DISTRAIN_IMAGE_URI" not in env
    assert "DISTRAIN_LINEAGE" not in "\n".join(plan.configs["user_data"])  # the description carries it


# ---------------------------------------------------------------- the run's URL


@pytest.mark.parametrize(
    "backend", [{}, {"instance": "ml.g5.xlarge"}, {"instance": "g4dn.12xlarge"}], ids=["local", "sagemaker", "ec2"]
)
def test_an_online_run_is_named_in_the_plan_with_its_url(tmp_path, backend):
    plan = dry(tmp_path, secrets={"WANDB_API_KEY": WANDB_REF}, **{"wandb.entity": "team"}, **backend)
    assert plan.summary["wandb"] == f"https://wandb.ai/team/distrain-cloud/runs/{plan.job_name}"
    no_entity = dry(tmp_path, secrets={"WANDB_API_KEY": WANDB_REF}, **{"wandb.project": "p"}, **backend)
    assert no_entity.summary["wandb"] == f"project p, run id {no_entity.job_name} (the job's log prints its URL)"


def test_an_offline_run_names_no_url(tmp_path):
    assert "wandb" not in dry(tmp_path).summary  # no key: training writes the run offline
    assert "wandb" not in dry(tmp_path, instance="ml.g5.xlarge").summary
    with_key = {"secrets": {"WANDB_API_KEY": WANDB_REF}}
    assert "wandb" not in dry(tmp_path, train_args=["--report-to", "none"], **with_key).summary
    spec = load_spec(None, {"local.workdir": str(tmp_path), **with_key})
    env = tracking_env(lineage="job-1", instance="local")
    # A local job inherits this environment: its mode, or a key of its own.
    assert wandb_run(spec, parse_args([]), env, here={"WANDB_MODE": "offline"}) is None
    assert wandb_run(load_spec(None, {}), parse_args([]), env, here={"WANDB_API_KEY": "set"}) == (
        "project distrain-cloud, run id job-1 (the job's log prints its URL)"
    )
    assert wandb_run(load_spec(None, {}), parse_args([]), env, here={}) is None


@pytest.mark.parametrize(
    "here, app",
    [
        ({"WANDB_BASE_URL": "https://wandb.example.com/"}, "https://wandb.example.com"),  # self-hosted
        ({"WANDB_BASE_URL": "https://api.wandb.ai"}, "https://wandb.ai"),  # W&B's cloud, named
        ({"WANDB_BASE_URL": "https://api.example.com"}, "https://app.example.com"),  # W&B's rule for api. hosts
        (
            {"WANDB_BASE_URL": "https://api.example.com", "WANDB_APP_URL": "https://ui.example.com"},
            "https://ui.example.com",
        ),
        ({}, "https://wandb.ai"),
    ],
)
def test_the_run_url_is_on_the_w_and_b_server_the_job_logs_to(tmp_path, here, app):
    """A local job inherits this environment: a self-hosted W&B (WANDB_BASE_URL, or the host
    `wandb login --host` saved) gets a link to its own app, as the W&B SDK derives it."""
    spec = load_spec(None, {"local.workdir": str(tmp_path)})
    env = tracking_env(lineage="job-1", instance="local")
    config = {"WANDB_CONFIG_DIR": str(tmp_path / "no-settings")}
    url = wandb_run(spec, parse_args(["--wandb-entity", "team"]), env, here={"WANDB_API_KEY": "k", **config, **here})
    assert url == f"{app}/team/distrain-cloud/runs/job-1"


def test_the_run_url_follows_wandb_login_host_and_is_unknown_for_a_cloud_jobs_secret_server(tmp_path):
    (tmp_path / "settings").write_text("[default]\nbase_url = https://wandb.corp.example\n")
    spec = load_spec(None, {"local.workdir": str(tmp_path)})
    env = tracking_env(lineage="job-1", instance="local")
    here = {"WANDB_API_KEY": "k", "WANDB_CONFIG_DIR": str(tmp_path)}
    assert (
        wandb_run(spec, parse_args(["--wandb-entity", "t"]), env, here=here)
        == "https://wandb.corp.example/t/distrain-cloud/runs/job-1"
    )
    secrets = {"WANDB_API_KEY": WANDB_REF, "WANDB_BASE_URL": "ssm:/distrain-cloud/wandb-url"}
    cloud = load_spec(None, {"instance": "ml.g5.xlarge", "secrets": secrets})
    assert wandb_run(cloud, parse_args(["--wandb-entity", "t"]), env, here={}) == (
        "project distrain-cloud, run id job-1 (the job's log prints its URL)"
    )


def test_submit_says_where_the_run_is_before_the_job_starts(capsys, monkeypatch, tmp_path):
    started: list[str] = []
    monkeypatch.setattr(api, "submit_job", lambda plan, wait=False: started.append(plan.job_name) or 0)
    monkeypatch.chdir(tmp_path)
    argv = ["submit", "--instance", "local", "--secret", f"WANDB_API_KEY={WANDB_REF}", "--wandb-entity", "team"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0 and err.splitlines() == [f"W&B run: https://wandb.ai/team/distrain-cloud/runs/{started[0]}"]


# ---------------------------------------------------------------- Hub settings the spec owns


def test_hub_revision_and_private_are_launcher_flags_passed_to_training(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    hub = ["--push-to-hub", "me/model", "--hub-revision", "exp/v2", "--hub-private", "--secret", f"HF_TOKEN={HF_REF}"]
    code, out, _ = run_cli(["submit", "--instance", "local", "--dry-run", *hub], capsys)
    assert code == 0 and "--hub-revision" in out and "exp/v2" in out  # the plan shows it
    code, out, _ = run_cli(["submit", "--instance", "local", "--dry-run", "--json", *hub], capsys)
    command = json.loads(out)["request"]["command"]
    argv = command[command.index("--") + 1 :]
    assert argv[argv.index("--hub-revision") + 1] == "exp/v2" and "--hub-private" in argv
    cloud = ["--instance", "ml.g5.xlarge", "--region", "us-east-1", "--role", ROLE]
    code, out, _ = run_cli(["submit", "--dry-run", "--json", *cloud, *hub], capsys)
    hyperparameters = json.loads(out)["request"]["HyperParameters"]
    assert (hyperparameters["hub_revision"], hyperparameters["hub_private"]) == ("exp/v2", "true")


@pytest.mark.parametrize("backend", [["--instance", "local"], ["--instance", "ml.g5.2xlarge", "--region", "us-east-1"]])
def test_a_hub_repo_that_cannot_exist_is_refused_at_plan_time(capsys, monkeypatch, tmp_path, backend):
    # It used to pass every plan and fail at the push, after the whole (paid) run.
    monkeypatch.chdir(tmp_path)
    argv = ["submit", *backend, "--dry-run", "--push-to-hub", "bad id!!"]
    code, out, err = run_cli([*argv, "--secret", f"HF_TOKEN={HF_REF}"], capsys)
    assert code == 2 and out == ""
    assert err.strip().endswith(
        "hub.repo_id (--push-to-hub): 'bad id!!' is not a Hub repo id: a repo id is NAME or NAMESPACE/NAME, each "
        "1-96 letters, digits, '-', '_' or '.', not starting or ending with '-' or '.', with no '--' or '..' and "
        "not ending in .git, e.g. me/tiny-gpt2"
    ), err
    assert not (tmp_path / "runs").exists()


def test_hub_settings_in_a_spec_file(tmp_path):
    spec = load_spec(None, {"hub": {"repo_id": "me/model", "revision": "v2", "private": True}})
    assert spec.training_argv("no", "job")[-5:] == [
        "--push-to-hub",
        "me/model",
        "--hub-revision",
        "v2",
        "--hub-private",
    ]
    assert "--hub-revision" not in load_spec(None, {"hub.repo_id": "me/model"}).training_argv("no", "job")


@pytest.mark.parametrize(
    "hub, expected",
    [
        ({"revision": "v2"}, "hub: revision (--hub-revision) needs the repo the model is pushed to: add --push"),
        ({"private": True}, "hub: private (--hub-private) needs the repo"),
        ({"repo_id": "me/m", "revision": "a..b"}, "hub.revision (--hub-revision): a branch is letters, digits"),
        ({"repo_id": "me/m", "revision": "refs/pr/1"}, "not a refs/ path"),
        ({"repo_id": "me/m", "revision": "-x"}, "a branch is letters"),
    ],
)
def test_bad_hub_settings_are_refused_naming_the_flag(hub, expected):
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_spec(None, {"hub": hub})


@pytest.mark.parametrize("flag", ["--hub-revision=x", "--hub-private", "--no-hub-private"])
def test_hub_settings_after_the_separator_are_refused(flag):
    with pytest.raises(UserError, match=f"give {flag.split('=')[0]} before `--`, not after it"):
        load_spec(None, {"hub.repo_id": "me/m", "train_args": [flag]})
    with pytest.raises(UserError, match=r"set hub\.(revision|private) at the top of the spec"):
        load_spec(None, {"hyperparameters": {flag.split("=")[0].removeprefix("--no-").lstrip("-"): "x"}})


def test_local_lineage_of_a_folder_without_a_plan_is_its_own(tmp_path):
    assert local._lineage(tmp_path, "job-1") == ((tmp_path / "job-1" / "checkpoints").resolve(), "job-1")
