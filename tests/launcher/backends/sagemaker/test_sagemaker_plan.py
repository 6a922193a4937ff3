"""SageMaker plans: exactly the CreateTrainingJob request, computed without one AWS call.

Every test here runs with no credentials and AWS_ENDPOINT_URL pointing at a closed port,
and fails if botocore makes any API call at all (see the `offline` fixture).
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import tarfile
from pathlib import Path

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import apimodel
from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.backends.sagemaker import backend as sm
from distrain_cloud.launcher.backends.sagemaker.images import parse_cuda_version
from distrain_cloud.launcher.memory import CHECK_NAME
from distrain_cloud.launcher.spec import load_spec
from distrain_cloud.training.args import hyperparameters_to_argv, parse_args
from distrain_cloud.training.contract import free_port

REPO = Path(__file__).resolve().parents[4]
EXAMPLE = REPO / "examples" / "sagemaker-gpt2-emotion.yaml"
ROLE = "arn:aws:iam::123456789012:role/distrain-sm"
HF_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"
ACCELERATE = "accelerate_config (node 0)"
CU130_IMAGE = (
    "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:"
    "2.9.0-transformers5.3.0-gpu-py312-cu130-ubuntu22.04"
)


def _no_aws_env(home: Path) -> dict[str, str]:
    """The process environment without a single AWS_* variable, and a HOME with no ~/.aws."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["HOME"] = str(home)
    return env


@pytest.fixture
def offline(no_aws_config, monkeypatch):
    """No credentials, no config, every endpoint a closed port, and any API call recorded and refused."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    import botocore.client

    calls: list[str] = []

    def refuse(self, operation_name, api_params):
        calls.append(f"{self.meta.service_model.service_name}.{operation_name}")
        raise AssertionError(f"a dry run called AWS: {calls[-1]}")

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", refuse)
    yield calls
    assert calls == [], f"dry-run planning made AWS calls: {calls}"


def test_the_offline_guard_catches_any_call(offline):
    """The guard the dry-run tests rely on: a live plan (which looks up the account) trips it."""
    with pytest.raises(AssertionError, match="a dry run called AWS: sts.GetCallerIdentity"):
        plan_job(spec(), dry_run=False)
    offline.clear()


def spec(**overrides):
    base = {"instance": "ml.p3.8xlarge", "region": "us-east-1", "sagemaker.role": ROLE}
    base.update(overrides)
    return load_spec(None, base)


def dry(**overrides):
    return plan_job(spec(**overrides), dry_run=True)


# ---------------------------------------------------------------- shape: processes, image, precision


def test_p3_8xlarge_runs_four_processes_per_node_on_a_cuda12_image_in_fp16(offline):
    plan = dry()
    acc = plan.configs[ACCELERATE]
    assert (acc["num_processes"], acc["num_machines"], acc["mixed_precision"]) == (4, 1, "fp16")
    assert acc["distributed_type"] == "MULTI_GPU" and acc["main_process_ip"] == "algo-1"
    assert plan.summary["processes"] == "4 per node, 4 in all"
    image = plan.request["AlgorithmSpecification"]["TrainingImage"]
    assert "cu13" not in image and parse_cuda_version(image)[0] == 12, image
    assert image == plan.summary["image"]
    assert plan.request["HyperParameters"]["precision"] == "fp16"
    assert plan.request["ResourceConfig"] == {
        "InstanceType": "ml.p3.8xlarge",
        "InstanceCount": 1,
        "VolumeSizeInGB": 100,
    }


def test_p3_8xlarge_on_two_nodes_is_eight_processes(offline):
    acc = dry(nodes=2).configs[ACCELERATE]
    assert (acc["num_processes"], acc["num_machines"]) == (8, 2)


@pytest.mark.parametrize("instance", ["ml.p3.2xlarge", "ml.p3.8xlarge", "ml.p3.16xlarge", "ml.p3dn.24xlarge"])
def test_no_volta_instance_ever_gets_a_cuda13_image(offline, instance):
    image = dry(instance=instance).request["AlgorithmSpecification"]["TrainingImage"]
    assert parse_cuda_version(image) < (13, 0), image


def test_g5_12xlarge_on_two_nodes_is_eight_processes_in_bf16(offline):
    plan = dry(instance="ml.g5.12xlarge", nodes=2)
    acc = plan.configs[ACCELERATE]
    assert (acc["num_processes"], acc["num_machines"], acc["mixed_precision"]) == (8, 2, "bf16")
    assert plan.request["ResourceConfig"]["InstanceCount"] == 2
    assert plan.request["HyperParameters"]["precision"] == "bf16"
    assert plan.summary["processes"] == "4 per node, 8 in all"


@pytest.mark.parametrize(
    "instance, nodes, buckets",
    [
        ("ml.p3.8xlarge", 1, "1000 MB: one bucket, one compiled graph (GPUs of one node over NVLink)"),
        ("ml.p3.8xlarge", 2, "25 MB: processes on 2 nodes, so the all-reduces overlap the backward"),
        ("ml.g5.12xlarge", 1, "25 MB: A10G GPUs, connected over PCIe, so the all-reduces overlap the backward"),
        ("ml.p3.2xlarge", 1, None),  # one GPU: no DDP
    ],
)
def test_the_plan_shows_the_ddp_buckets_the_training_processes_will_pick(offline, instance, nodes, buckets):
    # A run long enough to compile (the default's 252 steps of builtin:sentiment run eager: below).
    compiled = dry(instance=instance, nodes=nodes, train_args=["--max-steps", "2000"])
    assert compiled.configs.get("ddp_buckets") == buckets
    eager = dry(instance=instance, nodes=nodes).configs.get("ddp_buckets")
    assert eager == (None if buckets is None else "25 MB")  # eager DDP keeps the default buckets, no reason to give


@pytest.mark.parametrize(
    "instance, nodes, steps, preset, strategy",
    [
        ("ml.p4d.24xlarge", 1, 30000, "gpt2-small", "fsdp (auto: sharded in the compiled graph: 30,000 steps of 124M"),
        ("ml.p4d.24xlarge", 1, 30000, "gpt2-xl", "ddp (auto: 1,558M parameters: above 200M fsdp's in-graph engine"),
        ("ml.p4d.24xlarge", 1, 1000, "gpt2-small", "ddp (auto: 1,000 --max-steps: below 30,000 fsdp's in-graph"),
        # counted in --epochs: the plan cannot know the steps, the job will
        ("ml.p4d.24xlarge", 1, None, "gpt2-small", "ddp (auto: ddp, or fsdp sharded in the compiled graph for 30,000+"),
        ("ml.p4d.24xlarge", 2, 30000, "gpt2-small", "ddp (auto: processes on 2 nodes, where its small buckets overlap"),
        (
            "ml.g5.12xlarge",
            1,
            30000,
            "gpt2-small",
            "ddp (auto: A10G GPUs, connected over PCIe, where its small buckets",
        ),
        ("ml.p3.2xlarge", 1, 30000, "gpt2-small", "ddp (auto: one process)"),  # one GPU: no buckets either
    ],
)
def test_the_plan_shows_what_the_default_strategy_picks_on_the_instance(
    offline, instance, nodes, steps, preset, strategy
):
    """--strategy auto (the default) is resolved in the job; the plan shows its pick for a fresh
    start, and sizes the memory check and the configs for that pick. The request leaves the
    strategy to the job's default."""
    hp = {"task": "causal-lm", "preset": preset, **({"max_steps": steps} if steps else {})}
    plan = dry(instance=instance, nodes=nodes, hyperparameters=hp)
    assert plan.summary["strategy"].startswith(strategy), plan.summary["strategy"]
    assert "strategy" not in plan.request["HyperParameters"]
    in_graph = strategy.startswith("fsdp")
    assert ("fsdp_sharding" in plan.configs) is in_graph
    assert ("ddp_buckets" in plan.configs) is (not in_graph and instance != "ml.p3.2xlarge")
    fit = next(c for c in plan.checks if c.name == CHECK_NAME)
    assert ("fsdp sharded in the graph, compiled" in fit.detail) is in_graph, fit.detail


def test_fp8_on_one_gpu_with_the_default_strategy_is_planned_as_ddp(offline, capsys):
    # Auto resolves to ddp with fp8 (training/strategies.resolve_auto), so the plan takes it as it is.
    from clirun import run_cli

    code, out, err = run_cli(
        capsys, "submit", "--instance", "ml.g6.xlarge", "--precision", "fp8", "--role", ROLE, "--region",
        "us-east-1", "--dry-run", "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)["summary"]
    assert (summary["precision"], summary["strategy"]) == ("fp8", "ddp (auto: --precision fp8 applies to ddp)")


@pytest.mark.parametrize(("steps", "eager"), [("300", True), ("600", False)])
def test_a_plan_says_when_fp8_would_run_eager_and_that_it_is_slower_there(offline, steps, eager):
    """Under the compile threshold the job runs eager, where float8 is slower than bf16 (llama-1b
    on an H200: 0.74x, session 38): the plan's recipe line says so, with the two ways out."""
    plan = dry(instance="ml.p5.48xlarge", precision="fp8", train_args=["--max-steps", steps])
    recipe = plan.configs["fp8_recipe"]
    said = "; eager (default: 300 steps are too few to repay compiling (--compile to force); float8 runs slower eager"
    assert (said in recipe) is eager, recipe
    assert ("give --compile, or train a short run in bf16" in recipe) is eager


def test_a_dry_run_says_an_fp8_job_would_run_eager(offline, capsys):
    """What the user reads: the same line through `submit --dry-run --json`."""
    from clirun import run_cli

    from distrain_cloud.training.decisions import FP8_EAGER

    code, out, err = run_cli(
        capsys, "submit", "--instance", "ml.p5.48xlarge", "--precision", "fp8", "--role", ROLE, "--region",
        "us-east-1", "--dry-run", "--json", "--", "--max-steps", "300",
    )  # fmt: skip
    assert code == 0, err
    recipe = json.loads(out)["configs"]["fp8_recipe"]
    eager = f"; eager (default: 300 steps are too few to repay compiling (--compile to force); {FP8_EAGER})"
    assert recipe.endswith(eager), recipe


def test_a_plan_on_torchaos_float8_layers_says_the_image_must_carry_torchao(offline):
    plan = dry(instance="ml.p5.48xlarge", precision="fp8", strategy="ddp", train_args=["--fp8-linear", "torchao"])
    (said,) = [c for c in plan.checks if c.name == "torchao in the job's image"]
    assert said.ok is None and "no job installs it" in said.detail
    default = dry(instance="ml.p5.48xlarge", precision="fp8").checks
    assert not any(c.name == "torchao in the job's image" for c in default)


def test_deepspeed_batch_is_computed_from_the_real_world_size(offline):
    plan = dry(
        instance="ml.g5.12xlarge", nodes=2, strategy="zero3", train_args=["--batch-size", "4", "--grad-accum", "2"]
    )
    ds = plan.configs["deepspeed_config"]
    assert ds["train_batch_size"] == 4 * 2 * 8 and ds["zero_optimization"]["stage"] == 3
    assert ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]


def test_single_strategy_on_a_multi_gpu_instance_is_a_user_error(offline):
    with pytest.raises(
        UserError, match="strategy 'single' runs one process, but the cluster has 4; use --strategy ddp"
    ):
        dry(strategy="single")


def test_the_instance_is_sent_in_sagemaker_spelling(offline):
    assert dry(instance="ml.P3.8xlarge").request["ResourceConfig"]["InstanceType"] == "ml.p3.8xlarge"


def test_bf16_on_a_v100_is_refused_with_the_fix(offline):
    with pytest.raises(UserError, match=r"bf16 needs compute capability >= 8.0; ml.p3.8xlarge .*--precision fp16"):
        dry(precision="bf16")


def test_an_incompatible_explicit_image_names_the_instance_and_the_fix(offline):
    with pytest.raises(UserError) as e:
        dry(**{"sagemaker.image_uri": CU130_IMAGE})
    msg = str(e.value)
    assert "ml.p3.8xlarge" in msg and "CUDA 13.0" in msg
    assert "drop --image-uri" in msg and "cu12x" in msg
    assert "\n" not in msg


def test_a_compatible_explicit_image_is_sent_as_given(offline):
    uri = CU130_IMAGE.replace("cu130", "cu124")
    plan = dry(**{"sagemaker.image_uri": uri})
    assert plan.request["AlgorithmSpecification"]["TrainingImage"] == uri


def test_an_unknown_instance_gets_a_suggestion(offline):
    with pytest.raises(UserError, match=r"unknown instance type 'ml.p3.8xlrge'; did you mean ml.p3.8xlarge\?"):
        dry(instance="ml.p3.8xlrge")


def test_an_ec2_type_is_refused_with_the_sagemaker_spelling(offline):
    # the spec routes non-ml types to the (absent) ec2 backend; the SageMaker backend itself says what to write
    with pytest.raises(UserError, match=r"use ml.p3.8xlarge"):
        sm.BACKEND.plan(spec(instance="p3.8xlarge"))


def test_no_region_configured_assumes_us_east_1_and_says_so(offline):
    plan = dry(region=None)
    assert plan.summary["region"] == "us-east-1"
    (check,) = [c for c in plan.checks if c.name == "region"]
    assert check.ok is None and "--region" in check.detail


# ---------------------------------------------------------------- spot and checkpoint lineage


def test_spot_sets_managed_spot_and_a_max_wait_beyond_max_run(offline):
    plan = dry(spot=True, max_run="2h")
    r = plan.request
    assert r["EnableManagedSpotTraining"] is True
    stop = r["StoppingCondition"]
    assert stop["MaxRuntimeInSeconds"] == 7200 and stop["MaxWaitTimeInSeconds"] >= stop["MaxRuntimeInSeconds"]
    assert stop["MaxWaitTimeInSeconds"] == 2 * 7200  # the default: twice max_run
    assert r["CheckpointConfig"] == {
        "S3Uri": f"s3://distrain-cloud-123456789012-us-east-1/distrain-cloud/checkpoints/{plan.job_name}/",
        "LocalPath": "/opt/ml/checkpoints",
    }
    assert {"Key": "distrain-cloud:lineage", "Value": plan.job_name} in r["Tags"]
    assert "no current managed-spot price" in plan.cost["spot"]  # not a made-up band


def test_explicit_max_wait_is_sent(offline):
    stop = dry(spot=True, max_run="2h", max_wait="3h").request["StoppingCondition"]
    assert stop == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 10800}


def test_on_demand_sends_no_max_wait(offline):
    r = dry(max_run="2h").request
    assert r["EnableManagedSpotTraining"] is False and r["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200}


def test_max_wait_below_max_run_is_refused(offline):
    with pytest.raises(UserError, match=r"max_wait \(3600s\) must be >= max_run \(7200s\)"):
        dry(spot=True, max_run="2h", max_wait="1h")


def test_resume_keeps_the_lineage_checkpoint_location(offline):
    plan = dry(spot=True, resume_from="gpt2-emotion-20250101-000000-abcd", **{"sagemaker.bucket": "my-bucket"})
    uri = plan.request["CheckpointConfig"]["S3Uri"]
    assert uri == "s3://my-bucket/distrain-cloud/checkpoints/gpt2-emotion-20250101-000000-abcd/"
    assert plan.job_name not in uri
    assert {"Key": "distrain-cloud:lineage", "Value": "gpt2-emotion-20250101-000000-abcd"} in plan.request["Tags"]
    # not looked up in a dry run, and it says so
    assert [c.ok for c in plan.checks if c.name.startswith("resume from")] == [None]


# ---------------------------------------------------------------- cost


def test_max_cost_below_the_worst_case_fails_a_check(offline):
    plan = dry(max_run="6h", max_cost=50)
    assert plan.cost["worst_case_usd"] == pytest.approx(14.688 * 6, abs=0.01)
    (check,) = plan.failed_checks
    assert check.name == "cost <= --max-cost 50.0" and "$88.13" in check.detail
    with pytest.raises(UserError, match="plan check failed, nothing was created: cost <= --max-cost 50.0"):
        sm.BACKEND.submit(plan)  # refuses before any AWS call (offline would record one)


def test_max_cost_scales_with_nodes(offline):
    plan = dry(instance="ml.g5.12xlarge", nodes=2, max_run="1h", max_cost=14)
    assert plan.cost["worst_case_usd"] == pytest.approx(2 * 7.09, abs=0.01)
    assert [c.name for c in plan.failed_checks] == ["cost <= --max-cost 14.0"]
    assert not dry(instance="ml.g5.12xlarge", nodes=2, max_run="1h", max_cost=15).failed_checks


# ---------------------------------------------------------------- secrets


def test_secrets_travel_only_as_references(offline):
    refs = {"HF_TOKEN": HF_REF, "WANDB_API_KEY": "ssm:/team/wandb-key"}
    plan = dry(secrets=refs, **{"hub.repo_id": "me/model"})
    env = plan.request["Environment"]
    assert json.loads(env["DISTRAIN_SECRETS"]) == refs
    tracking = {"DISTRAIN_LINEAGE", "DISTRAIN_INSTANCE_TYPE", "DISTRAIN_IMAGE_URI", "DISTRAIN_WANDB_RUN_ID"}
    assert set(env) == {"DISTRAIN_SECRETS", "HF_HUB_DISABLE_TELEMETRY", *tracking}
    text = json.dumps(plan.request)
    assert text.count(HF_REF) == 1 and text.count("ssm:/team/wandb-key") == 1  # only in DISTRAIN_SECRETS
    assert not any(k.lower() in ("hf_token", "wandb_api_key") for k in plan.request["HyperParameters"])
    assert plan.request["HyperParameters"]["push_to_hub"] == "me/model"


def test_a_pasted_secret_value_is_refused_without_echoing_it(offline):
    with pytest.raises(UserError) as e:
        dry(secrets={"HF_TOKEN": "hf_pastedRealTokenValue123"})
    assert "HF_TOKEN must be a reference" in str(e.value)
    assert "hf_pastedRealTokenValue123" not in str(e.value)


def test_a_hub_push_without_a_token_reference_is_refused(offline):
    with pytest.raises(UserError, match="--push-to-hub me/model needs a Hub token: add --secret HF_TOKEN=<"):
        dry(**{"hub.repo_id": "me/model"})


# ---------------------------------------------------------------- hyperparameters and metrics


def test_hyperparameters_are_strings_that_round_trip_to_the_same_training_args(offline):
    s = spec(
        strategy="zero2",
        hyperparameters={
            "task": "causal-lm",
            "lr": 3e-4,
            "batch_size": 8,
            "compile": True,
            "max_steps": 100,
            "report_to": "none",
            "generate_prompt": "Once upon a time",
        },
        train_args=["--warmup-steps", "10", "--grad-accum", "2"],
        secrets={"HF_TOKEN": HF_REF},
        **{"hub.repo_id": "me/model"},
    )
    plan = plan_job(s, dry_run=True)
    hp = plan.request["HyperParameters"]
    assert hp and all(isinstance(k, str) and isinstance(v, str) for k, v in hp.items())
    assert hp["compile"] == "true" and hp["lr"] == "0.0003" and hp["generate_prompt"] == "Once upon a time"
    # what the job does: hyperparameters.json -> argv -> TrainArgs (node_launch --hyperparameters)
    in_job = parse_args(hyperparameters_to_argv(json.loads(json.dumps(hp))))
    expected = parse_args(s.training_argv(plan.summary["precision"], plan.job_name))
    assert in_job == expected
    assert (in_job.task, in_job.strategy, in_job.precision, in_job.grad_accum, in_job.run_name) == (
        "causal-lm",
        "zero2",
        "fp16",
        2,
        plan.job_name,
    )


def test_the_example_spec_round_trips_too(offline):
    s = load_spec(EXAMPLE)
    plan = plan_job(s, dry_run=True)
    hp = plan.request["HyperParameters"]
    assert parse_args(hyperparameters_to_argv(hp)) == parse_args(s.training_argv("fp16", plan.job_name))


def _emitted_line(tmp_path, step, metrics, capsys) -> str:
    """The very line the entry point prints for `metrics` (Trainer._emit, with a stand-in accelerator)."""
    from distrain_cloud.training.tracking import GuardedTracking
    from distrain_cloud.training.trainer import Trainer

    class Acc:
        is_main_process = True
        trackers: list = []

        def log(self, *a, **k):
            pass

    trainer = object.__new__(Trainer)
    trainer.accelerator, trainer.metrics_file = Acc(), tmp_path / "metrics.jsonl"
    trainer.tracking = GuardedTracking(trainer.accelerator, print)
    trainer.max_steps = 1000  # train lines end with progress=STEP/1000
    capsys.readouterr()
    trainer._emit(step, metrics)
    (line,) = capsys.readouterr().out.splitlines()
    return line


def test_metric_regexes_match_the_entry_points_own_lines(offline, tmp_path, capsys):
    definitions = {
        m["Name"]: re.compile(m["Regex"]) for m in dry().request["AlgorithmSpecification"]["MetricDefinitions"]
    }
    assert set(definitions) >= {"train_loss", "eval_loss", "eval_accuracy", "tokens_per_sec"}
    train = _emitted_line(
        tmp_path,
        10,
        {"train_loss": 1.2345, "lr": 4.5e-05, "tokens_per_sec": 81234.56789, "step_time": 0.25, "data_wait_pct": 1.5},
        capsys,
    )
    assert train.startswith("step=10 train_loss=1.2345 lr=4.5e-05 ")
    evals = _emitted_line(
        tmp_path,
        500,
        {"eval_loss": 0.4321, "eval_accuracy": 0.9, "eval_f1_macro": 0.875, "eval_samples": 2000.0},
        capsys,
    )
    assert evals.startswith("step=500 eval_loss=0.4321 eval_accuracy=0.9 ")
    lm = _emitted_line(tmp_path, 20, {"eval_loss": 3.5, "eval_perplexity": 33.11545, "eval_samples": 10.0}, capsys)

    def value(name, line):
        m = definitions[name].search(line)
        return None if m is None else float(m.group(1))

    assert value("train_loss", train) == 1.2345
    assert value("tokens_per_sec", train) == pytest.approx(81234.6)
    assert value("eval_loss", train) is None and value("eval_accuracy", train) is None
    assert value("eval_loss", evals) == 0.4321 and value("eval_accuracy", evals) == 0.9
    assert value("eval_f1_macro", evals) == 0.875 and value("train_loss", evals) is None
    assert value("eval_perplexity", lm) == pytest.approx(33.11545, rel=1e-5)
    nan = _emitted_line(tmp_path, 30, {"train_loss": float("nan"), "lr": 1e-3}, capsys)
    assert definitions["train_loss"].search(nan).group(1) == "nan"


# ---------------------------------------------------------------- code bundle, names, entrypoint


def test_the_code_bundle_is_content_addressed_stable_and_tagged(offline):
    a, b = dry(), dry()
    assert a.job_name != b.job_name
    assert a.bundle["sha256"] == b.bundle["sha256"] and a.payload.bundle == b.payload.bundle
    sha = a.bundle["sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", sha)
    (code,) = [c for c in a.request["InputDataConfig"] if c["ChannelName"] == "code"]
    assert code["DataSource"]["S3DataSource"]["S3Uri"] == a.bundle["s3"]
    assert a.bundle["s3"].endswith(f"/distrain-cloud/code/{sha}.tar.gz")
    assert {"Key": "distrain-cloud:code-sha256", "Value": sha} in a.request["Tags"]
    with tarfile.open(fileobj=io.BytesIO(a.payload.bundle), mode="r:gz") as tar:
        names = set(tar.getnames())
    # what the entrypoint runs must be in the bundle
    assert {"distrain_cloud/training/node_launch.py", "distrain_cloud/infra/secret_env.py"} <= names


def test_the_entrypoint_unpacks_the_bundle_and_runs_its_job_script(offline):
    plan = dry()
    entry = plan.request["AlgorithmSpecification"]["ContainerEntrypoint"]
    assert entry[:2] == ["/bin/bash", "-c"]
    script = entry[2]
    assert "/input/data/code/" in script and "/opt/ml" in script and "\n" not in script
    assert 'exec bash "$R/code/distrain_cloud/training/job_entry.sh" --hyperparameters' in script
    # The rest travels in the bundle the plan hashed: secrets resolved, then the node launcher.
    with tarfile.open(fileobj=io.BytesIO(plan.payload.bundle), mode="r:gz") as tar:
        member = tar.getmember("distrain_cloud/training/job_entry.sh")
        job_script = tar.extractfile(member).read().decode()
    assert member.mode & 0o111
    assert "python -m distrain_cloud.infra.secret_env -- python -m distrain_cloud.training.node_launch" in job_script


def test_job_names_fit_sagemaker_and_are_unique(offline):
    long = "a" * 32  # the longest prefix a spec allows
    plans = [dry(name=long) for _ in range(3)] + [dry() for _ in range(3)]
    names = [p.job_name for p in plans]
    assert len(set(names)) == len(names)
    for p in plans:
        assert len(p.job_name) <= 63 and re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", p.job_name)
        assert p.request["TrainingJobName"] == p.job_name
        assert apimodel.problems("sagemaker", "CreateTrainingJob", p.request) == []
    assert names[0].startswith(long + "-") and re.search(r"-\d{8}-\d{6}-[0-9a-f]{6}$", names[0])


def test_inputs_must_be_s3_and_code_is_reserved(offline):
    plan = dry(inputs={"train": "s3://data/train/"})
    assert [c["ChannelName"] for c in plan.request["InputDataConfig"]] == ["code", "train"]
    with pytest.raises(UserError, match="SageMaker channels must be s3:// URIs"):
        dry(inputs={"train": "/local/path"})
    with pytest.raises(UserError, match="reserved for the code bundle"):
        dry(inputs={"code": "s3://some-bucket/y"})


def test_a_role_name_becomes_an_arn_placeholder_in_a_dry_run(offline):
    plan = dry(**{"sagemaker.role": "distrain-cloud-sagemaker"})
    assert plan.request["RoleArn"] == "arn:aws:iam::<account>:role/distrain-cloud-sagemaker"
    assert (
        plan.request["OutputDataConfig"]["S3OutputPath"]
        == "s3://distrain-cloud-<account>-us-east-1/distrain-cloud/jobs/"
    )


def test_with_no_role_the_plan_names_the_jobs_own_role_under_the_stack(offline):
    plan = dry(**{"sagemaker.role": None, "stack": "team-a"})
    job = plan.job_name
    assert plan.request["RoleArn"] == f"arn:aws:iam::<account>:role/distrain-cloud/team-a/{job}"
    assert plan.summary["output"].startswith("s3://<stack-team-a-bucket>/")
    assert "this job's own" in plan.summary["role"]
    (check,) = [c for c in plan.checks if c.name == "job role isolates the job"]
    assert check.ok is True and f"/distrain-cloud/team-a/{job}" in check.detail
    # The plan shows the role's policy: this job's prefixes as literals, no other job's.
    shown = plan.configs["job_role"]
    assert shown["name"] == job and shown["path"] == "/distrain-cloud/team-a/"
    assert shown["permissions_boundary"] == "<stack team-a's JobBoundary policy>"
    resources = {s["Sid"]: s["Resource"] for s in shown["policy"]["Statement"]}
    assert resources["OwnJob"] == f"arn:aws:s3:::<stack-team-a-bucket>/distrain-cloud/jobs/{job}/*"
    assert resources["OwnLineage"] == f"arn:aws:s3:::<stack-team-a-bucket>/distrain-cloud/checkpoints/{job}/*"


def test_with_a_role_of_the_users_the_plan_says_the_job_is_not_isolated(offline):
    plan = dry(**{"sagemaker.role": "arn:aws:iam::123456789012:role/mine"})
    assert plan.request["RoleArn"] == "arn:aws:iam::123456789012:role/mine"
    assert "not isolated" in plan.summary["role"] and "job_role" not in plan.configs


# ---------------------------------------------------------------- the real CLI, no credentials at all


def test_cli_dry_run_needs_no_credentials(cli, tmp_path):
    r = cli("submit", str(EXAMPLE), "--dry-run", "--json", env=_no_aws_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["backend"] == "sagemaker" and plan["configs"][ACCELERATE]["num_processes"] == 4
    assert plan["request"]["ResourceConfig"]["InstanceType"] == "ml.p3.8xlarge"
    assert "cu13" not in plan["request"]["AlgorithmSpecification"]["TrainingImage"]
    assert plan["request"]["EnableManagedSpotTraining"] is True
    assert "payload" not in plan  # the bundle's bytes stay out of the printed plan
    human = cli("submit", str(EXAMPLE), "--dry-run", env=_no_aws_env(tmp_path), cwd=tmp_path)
    assert human.returncode == 0 and "4 per node" in human.stdout and "[FAIL]" not in human.stdout


def test_cli_dry_run_opens_no_connection(cli, tmp_path):
    """With credentials present and every endpoint pointed at a listening socket, nothing connects."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        env = {
            **_no_aws_env(tmp_path),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{listener.getsockname()[1]}",
        }
        r = cli(
            "submit", str(EXAMPLE), "--role", "distrain-cloud-sagemaker", "--dry-run", "--json", env=env, cwd=tmp_path
        )
        assert r.returncode == 0, r.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_cli_dry_run_over_budget_exits_non_zero(cli, tmp_path):
    r = cli("submit", str(EXAMPLE), "--max-cost", "10", "--dry-run", env=_no_aws_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 1
    assert "[FAIL] cost <= --max-cost 10.0" in r.stdout


def test_cli_incompatible_image_is_one_line(cli, tmp_path):
    r = cli("submit", str(EXAMPLE), "--image-uri", CU130_IMAGE, "--dry-run", env=_no_aws_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: image ") and "ml.p3.8xlarge" in line and "drop --image-uri" in line


def test_a_malformed_secret_flag_never_echoes_what_was_pasted(cli, tmp_path):
    r = cli(
        "submit", str(EXAMPLE), "--secret", "hf_pastedtokenvalue", "--dry-run", env=_no_aws_env(tmp_path), cwd=tmp_path
    )
    assert r.returncode != 0
    assert "--secret expects NAME=VALUE" in r.stderr
    assert "pastedtokenvalue" not in r.stderr + r.stdout


# ---------------------------------------------------------------------- warm pools (--keep-alive)


@pytest.mark.slow  # a plan with its code bundle, through the CLI
def test_keep_alive_keeps_a_warm_pool_and_the_plan_shows_what_it_costs(offline, capsys):
    from clirun import run_cli

    code, out, err = run_cli(
        capsys, "submit", "--instance", "ml.g5.12xlarge", "--nodes", "2", "--keep-alive", "30m", "--role", ROLE,
        "--region", "us-east-1", "--max-run", "2h", "--dry-run", "--json",
    )  # fmt: skip
    assert code == 0, err
    plan = json.loads(out)
    assert plan["request"]["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert apimodel.problems("sagemaker", "CreateTrainingJob", plan["request"]) == []
    # 2 nodes x $7.09/h for 2 h, then 2 x $7.09/h for the half hour they stay warm
    assert plan["cost"]["keep_alive_usd"] == 7.09 and plan["cost"]["worst_case_usd"] == 35.45
    assert plan["summary"]["keep_alive"].startswith(
        "1800 s after the job ends, 2 x ml.g5.12xlarge stay warm for the next job of the same instance settings "
        "($7.09 if no job reuses it, AWS list price as of"
    )
    # The field is checked against the API model like the rest of the request.
    wrong = json.loads(json.dumps(plan["request"]))
    wrong["ResourceConfig"]["KeepAlivePeriodInSeconds"] = -1
    assert apimodel.problems("sagemaker", "CreateTrainingJob", wrong) == [
        ("ResourceConfig.KeepAlivePeriodInSeconds", "-1 is below the minimum 0")
    ]


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--instance", "ml.g5.xlarge", "--keep-alive", "2h"],
            "error: the command line: sagemaker.keep_alive (--keep-alive): 7200 s: SageMaker keeps a warm pool at "
            "most 3600 s (1h); give e.g. 30m, or 0 for none",
        ),
        (
            ["--instance", "g5.xlarge", "--keep-alive", "20m"],
            "error: the command line: --keep-alive keeps a SageMaker warm pool; g5.xlarge is not a SageMaker (ml.*) "
            "instance: drop --keep-alive",
        ),
        (
            # SageMaker Developer Guide, "Train Using SageMaker Managed Warm Pools", considerations:
            # warm pools cannot be used with spot instances; the request itself would be accepted.
            ["--instance", "ml.g5.xlarge", "--spot", "--keep-alive", "20m"],
            "error: the command line: --keep-alive keeps a SageMaker warm pool, which AWS does not offer for spot "
            "jobs: drop --keep-alive or --spot (a warm pool also needs its Service Quotas quota raised: it starts "
            "at 0 per instance type)",
        ),
        (
            # Only EC2 jobs restart on AWS's side; SageMaker would accept the flags and drop them.
            ["--instance", "ml.g5.xlarge", "--spot", "--max-restarts", "5"],
            "error: the command line: --max-restarts applies to EC2 spot jobs, not sagemaker ones (SageMaker "
            "resumes an interrupted spot job itself, within --max-wait): drop it",
        ),
        (
            ["--instance", "ml.g5.xlarge", "--spot", "--on-demand-after", "1"],
            "error: the command line: --on-demand-after applies to EC2 spot jobs, not sagemaker ones (SageMaker "
            "resumes an interrupted spot job itself, within --max-wait): drop it",
        ),
    ],
    ids=["keep-alive-2h", "keep-alive-on-ec2", "keep-alive-spot", "max-restarts", "on-demand-after"],
)
def test_keep_alive_beyond_an_hour_or_off_sagemaker_is_refused_in_one_line(offline, capsys, flags, message):
    from clirun import run_cli

    code, out, err = run_cli(capsys, "submit", *flags, "--region", "us-east-1", "--dry-run")
    assert code == 2 and out == "" and err.strip().splitlines() == [message]
