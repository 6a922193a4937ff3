"""EC2 plans: the RunInstances request, user data and job description, without one AWS call.

Every plan test runs with fake credentials and fails if botocore is asked to make any API call
(the `aws_calls` fixture). Refusals are one line naming the flag or key, before any call.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import apimodel, bundle, catalog
from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.backends.ec2 import backend as ec2
from distrain_cloud.launcher.backends.ec2 import request as ec2_request
from distrain_cloud.launcher.backends.ec2.user_data import EC2_REHEARSAL_SWITCHES
from distrain_cloud.launcher.cli import main
from distrain_cloud.launcher.spec import load_spec

REPO = Path(__file__).resolve().parents[4]
ACCELERATE = "accelerate_config (node 0)"
HF_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"
WANDB_REF = "ssm:/team/wandb-key"


@pytest.fixture(autouse=True)
def no_calls(aws_calls):
    """Fake credentials present, and any AWS API call refused and recorded: plans make none."""
    yield aws_calls
    assert aws_calls == [], f"planning made AWS calls: {aws_calls}"


def dry(**overrides):
    base = {"instance": "g4dn.12xlarge", "region": "us-east-1"}
    return plan_job(load_spec(None, {**base, **overrides}), dry_run=True)


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as end:
        main(argv)
    err = capsys.readouterr().err
    return end.value.code, [line for line in err.splitlines() if line.strip()]


def encoded(request: dict) -> dict:
    return {**request, "UserData": base64.b64encode(request["UserData"].encode()).decode()}


# ---------------------------------------------------------------- shape: processes, AMI, precision


@pytest.mark.slow  # a cloud plan (5 s on a loaded machine)
def test_fp8_on_h100s_launches_bf16_processes_that_convert_their_linears():
    """Accelerate sees bf16 autocast; --precision fp8 reaches the training processes (training/fp8.py)."""
    plan = dry(instance="p5.48xlarge", precision="fp8", strategy="ddp")
    assert plan.configs[ACCELERATE]["mixed_precision"] == "bf16"
    argv = plan.configs["job.json"]["train_argv"]
    assert argv[argv.index("--precision") + 1] == "fp8"


@pytest.mark.slow  # cloud plans
@pytest.mark.parametrize(
    "train_args, torchao",
    [([], False), (["--fp8-linear", "torchao"], True), (["--fp8-recipe", "rowwise"], True)],
    ids=["native", "torchao", "rowwise"],
)
def test_an_fp8_plan_says_when_the_image_must_carry_torchao(train_args, torchao):
    """No job installs torchao: a plan on torchao's float8 layers says the image must carry it (a
    check it cannot make, shown, not failed); the default native layers need torch alone."""
    plan = dry(instance="p5.48xlarge", precision="fp8", strategy="ddp", train_args=train_args)
    said = [c for c in plan.checks if c.name == "torchao in the job's image"]
    assert [c.ok for c in said] == ([None] if torchao else [])
    assert not plan.failed_checks


def test_g4dn_12xlarge_runs_four_processes_in_fp16_on_a_t4_capable_ami():
    plan = dry(strategy="zero2")
    request, config = plan.request, plan.configs[ACCELERATE]
    assert (config["num_processes"], config["num_machines"], config["mixed_precision"]) == (4, 1, "fp16")
    assert (
        plan.configs["deepspeed_config"]["fp16"]["enabled"] and not plan.configs["deepspeed_config"]["bf16"]["enabled"]
    )
    family = catalog.AMI_FAMILIES[plan.summary["ami_family"]]
    assert "T4" in family.gpu_models and family.python == "/opt/pytorch/bin/python" and family.torch is None
    assert family.ssm_parameter in request["ImageId"]  # a placeholder naming where the AMI comes from
    assert request["InstanceType"] == "g4dn.12xlarge" and request["MinCount"] == request["MaxCount"] == 1
    # IMDSv2 only, and one hop: a container on the node (one more hop) cannot take the role's credentials.
    metadata = {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1}
    assert request["MetadataOptions"] == metadata
    assert request["InstanceInitiatedShutdownBehavior"] == "terminate"
    (volume,) = request["BlockDeviceMappings"]
    assert volume["DeviceName"] == family.root_device
    assert volume["Ebs"] == {"VolumeSize": 200, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}
    assert "NetworkInterfaces" not in request and "Placement" not in request  # one node: neither
    assert "InstanceMarketOptions" not in request
    description = plan.configs["job.json"]
    assert (description["nodes"], description["processes_per_node"], description["attempt"]) == (1, 4, 1)
    assert description["train_argv"][description["train_argv"].index("--precision") + 1] == "fp16"


def test_p4d_on_two_nodes_is_eight_processes_each_with_efa_and_the_placement_group():
    plan = dry(instance="p4d.24xlarge", nodes=2, strategy="zero3")
    request, config = plan.request, plan.configs[ACCELERATE]
    assert (config["num_processes"], config["num_machines"], config["mixed_precision"]) == (16, 2, "bf16")
    assert plan.summary["processes"] == "8 per node, 16 in all"
    assert plan.configs["job.json"]["processes_per_node"] == 8
    assert request["MinCount"] == request["MaxCount"] == 2  # all or nothing
    # The stack's default subnets give public IPv4 addresses: one EFA interface, and the plan says
    # why (tests/launcher/backends/ec2/test_network.py: one per network card in a private subnet).
    (interface,) = request["NetworkInterfaces"]
    assert interface["InterfaceType"] == "efa" and interface["DeviceIndex"] == 0
    assert interface["Groups"] == [ec2_request.GROUP_PLACEHOLDER]  # the job's own, made at submit
    assert "SecurityGroupIds" not in request and "SubnetId" not in request  # on the interface instead
    assert plan.summary["network"].startswith("1 EFA interface, on network card 0 of 4, 100 Gbps baseline")
    assert request["Placement"]["GroupName"] == plan.job_name  # the job's own cluster placement group
    assert {t["ResourceType"] for t in request["TagSpecifications"]} == {"instance", "volume", "network-interface"}
    assert (
        plan.configs["deepspeed_config"]["train_batch_size"]
        == 16
        * plan.configs["deepspeed_config"]["train_micro_batch_size_per_gpu"]
        * plan.configs["deepspeed_config"]["gradient_accumulation_steps"]
    )


def test_p3_8xlarge_gets_the_proprietary_driver_ami_with_its_own_torch_and_fp16():
    plan = dry(instance="p3.8xlarge")
    family = catalog.AMI_FAMILIES[plan.summary["ami_family"]]
    assert family.name == "proprietary-base" and "V100" in family.gpu_models
    assert "oss" not in family.ssm_parameter and family.ssm_parameter in plan.request["ImageId"]
    assert plan.configs[ACCELERATE]["mixed_precision"] == "fp16"
    assert plan.request["BlockDeviceMappings"][0]["DeviceName"] == "/dev/xvda"  # Amazon Linux 2
    user_data = plan.request["UserData"]
    assert family.python in user_data and '"$PY" -m venv "$WORK/venv"' in user_data
    assert "torch==2.7.1" in user_data  # a CUDA 12.6 build: still runs on V100


@pytest.mark.parametrize("instance", ["p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge"])
def test_no_volta_instance_ever_gets_an_oss_driver_ami(instance):
    plan = dry(instance=instance)
    assert "oss-nvidia-driver" not in plan.request["ImageId"]


def test_every_gpu_in_the_catalog_has_an_ami_family_that_drives_it():
    for instance in catalog.all_instances():
        if not instance.sagemaker:
            family = catalog.ami_family(instance)
            assert instance.gpu_model is None or instance.gpu_model in family.gpu_models, instance.name


def test_spot_is_one_time_and_terminates_on_interruption():
    request = dry(spot=True).request
    assert request["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
    }


def test_tags_name_the_job_lineage_stack_and_code():
    plan = dry(stack="team-a")
    tags = {t["Key"]: t["Value"] for t in plan.request["TagSpecifications"][0]["Tags"]}
    assert tags["distrain-cloud:stack"] == "team-a" and tags["distrain-cloud:job"] == plan.job_name
    assert tags["distrain-cloud:lineage"] == plan.job_name and tags["distrain-cloud:attempt"] == "1"
    assert tags["distrain-cloud:code-sha256"] == plan.bundle["sha256"]
    assert plan.configs["job.json"]["stack_tag"] == {"Key": "distrain-cloud:stack", "Value": "team-a"}


def test_the_cost_uses_the_ec2_price_not_sagemakers():
    plan = dry(nodes=2, max_run="1h")
    # max-run, the hard stop's 10-minute grace and a minute per launch (tests/launcher/backends/ec2/test_cost_cap.py)
    assert plan.cost["worst_case_usd"] == pytest.approx(
        2 * catalog.hourly_price("g4dn.12xlarge", "us-east-1") * (3600 + 600 + 60) / 3600, abs=0.01
    )
    assert plan.cost["worst_case_usd"] < 2 * catalog.hourly_price("ml.g4dn.12xlarge", "us-east-1") * 4260 / 3600
    assert [c.name for c in dry(nodes=2, max_run="1h", max_cost=3).failed_checks] == ["cost <= --max-cost 3.0"]


def test_a_cpu_instance_runs_ddp_in_one_process_without_precision():
    plan = dry(instance="c5.2xlarge", strategy="ddp", nodes=2)
    config = plan.configs[ACCELERATE]
    assert (config["num_processes"], config["mixed_precision"], config["use_cpu"]) == (2, "no", True)


# ---------------------------------------------------------------- user data and job description


def test_user_data_stops_hard_first_verifies_the_bundle_and_hands_over_to_the_agent():
    plan = dry(max_run="2h")
    lines = plan.request["UserData"].splitlines()
    assert lines[0] == "#!/bin/bash"
    first_command = next(line for line in lines[1:] if not line.startswith("#"))
    assert first_command == "${DISTRAIN_EC2_HARD_STOP:-shutdown -h} +130 || true"  # max_run + 10 minutes
    text = plan.request["UserData"]
    assert plan.bundle["sha256"] in text and "bundle hash mismatch" in text
    agent = lines[-2]
    assert agent.startswith('"$PY" -m distrain_cloud.launcher.backends.ec2.agent --job ')
    # job.json's bytes pinned as the bundle's are: the agent checks them before it trusts any of them.
    import hashlib

    pin = hashlib.sha256(plan.payload.job_json).hexdigest()
    assert json.loads(plan.payload.job_json) == plan.configs["job.json"]
    assert f"/distrain-cloud/jobs/{plan.job_name}/job.json' --job-sha256 {pin} || fail " in agent
    assert lines[-1] == "$POWEROFF"  # whatever the agent did, the node ends
    order = [text.index(s) for s in ("shutdown -h", "boot.py", "pip install", "-m distrain_cloud.launcher")]
    assert order == sorted(order)
    for switch in EC2_REHEARSAL_SWITCHES:
        assert "${" + switch + ":-" in text


def test_the_job_description_has_every_key_of_the_contract():
    description = dry(nodes=2, max_run="3h").configs["job.json"]
    contract = {
        "job", "lineage", "attempt", "nodes", "processes_per_node", "train_argv", "secrets", "region", "bucket",
        "prefix", "code_sha256", "deadline", "log_group", "stack_tag", "rendezvous_timeout_s", "checkpoint_uri",
        "model_uri", "output_uri", "main_port",
    }  # fmt: skip
    assert contract <= set(description)
    assert description["deadline"] == pytest.approx(description["submitted"] + 3 * 3600)
    assert description["checkpoint_uri"].endswith(f"/distrain-cloud/checkpoints/{description['lineage']}/")
    assert description["model_uri"].endswith(f"/jobs/{description['job']}/model/")
    assert (description["rendezvous_timeout_s"], description["main_port"]) == (600, 29500)


def test_user_data_holds_no_secret_and_job_json_only_references(monkeypatch):
    # Credentials of the launching machine must appear nowhere, secret references only in job.json.
    monkeypatch.setenv("HF_TOKEN", "fake-local-hf-value-0123456789")
    plan = dry(secrets={"HF_TOKEN": HF_REF, "WANDB_API_KEY": WANDB_REF}, **{"hub.repo_id": "me/model"})
    user_data, description = plan.request["UserData"], plan.configs["job.json"]
    assert HF_REF not in user_data and WANDB_REF not in user_data
    assert description["secrets"] == {"HF_TOKEN": HF_REF, "WANDB_API_KEY": WANDB_REF}
    text = plan.to_json()
    assert "fake-local-hf-value" not in text and "testing" not in user_data  # the fixture's fake AWS keys
    check = next(c for c in plan.checks if c.name == "user data holds no secret")
    assert check.ok is True


def test_the_secret_check_fails_when_a_credential_would_travel(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "fake-wandb-value-0123456789")
    check = ec2_request.secret_free_check("echo fake-wandb-value-0123456789", {}, {"HF_TOKEN": HF_REF})
    assert check.ok is False and check.detail.startswith("WANDB_API_KEY would be sent")
    assert "fake-wandb-value" not in check.detail
    assert ec2_request.secret_free_check(f"x {HF_REF}", {}, {"HF_TOKEN": HF_REF}).ok is False


def test_user_data_stays_under_16_kb_and_a_bigger_one_fails_the_check(monkeypatch):
    plan = dry(instance="p3.8xlarge", nodes=2, spot=True, secrets={"HF_TOKEN": HF_REF})
    assert len(plan.request["UserData"].encode()) < 8 * 1024  # half the limit: room to grow
    check = next(c for c in plan.checks if c.name.startswith("user data <="))
    assert check.ok is True and check.name == "user data <= 16384 bytes"
    monkeypatch.setattr(ec2, "train_requirements", lambda: [f"package-{i}>=1.0" for i in range(1200)])
    big = dry()
    assert [c.name for c in big.failed_checks] == ["user data <= 16384 bytes"]


def test_requirements_are_the_train_extra_without_torch():
    found = ec2.train_requirements()
    names = {r.split(">")[0].split("=")[0].split("<")[0].lower() for r in found}
    assert {"transformers", "accelerate", "datasets", "deepspeed"} <= names and "torch" not in names


# ---------------------------------------------------------------- ClientToken


def test_the_client_token_is_stable_for_one_job_and_attempt():
    plan = dry(nodes=2)
    found = plan.payload
    # what preflight does: render the same job again
    again = ec2.BACKEND._place(plan, found.where, found.parts, found.code_key, found.bundle)
    assert again.request["ClientToken"] == plan.request["ClientToken"] == f"{plan.job_name}-a1"
    assert ec2_request.client_token(plan.job_name, 1) == ec2_request.client_token(plan.job_name, 1)
    tokens = {ec2_request.client_token(plan.job_name, a, z) for a in (1, 2) for z in (0, 1)}
    assert len(tokens) == 4  # another attempt or zone is another launch
    longest = "a" * 63
    token = ec2_request.client_token(longest, 12, 3)
    assert len(token) == 64 and token != ec2_request.client_token(longest, 12, 4)


# ---------------------------------------------------------------- refusals before any AWS call

COMMON = ["submit", "--region", "us-east-1"]
REFUSALS = {
    "unknown instance type": (["--instance", "g4dn.13xlarge"], "unknown instance type 'g4dn.13xlarge'"),
    "no GPU for a ZeRO strategy": (
        ["--instance", "m5.xlarge", "--strategy", "zero2"],
        "--strategy zero2 needs GPUs and --instance m5.xlarge has none",
    ),
    "too many nodes for the placement group": (
        ["--instance", "p4d.24xlarge", "--nodes", "20"],
        "--nodes 20: a cluster placement group launches at most 16",
    ),
    "bf16 on a T4": (["--instance", "g4dn.12xlarge", "--precision", "bf16"], "--precision bf16 needs compute"),
    "fp8 on an A100": (
        ["--instance", "p4d.24xlarge", "--precision", "fp8", "--strategy", "ddp"],
        "--precision fp8 needs compute capability >= 8.9 (H100, L4)",
    ),
    "fp8 under a sharded strategy": (
        ["--instance", "p5.48xlarge", "--precision", "fp8", "--strategy", "zero2"],
        "--precision fp8 runs under --strategy ddp or single, not zero2",
    ),
    "single on four GPUs": (["--instance", "g4dn.12xlarge", "--strategy", "single"], "strategy 'single'"),
    "input channels": (["--instance", "g5.xlarge", "--input", "train=s3://my-bucket/data"], "--input"),
}
SPEC_REFUSALS = {
    "an AMI family that cannot drive a V100": (
        "instance: p3.8xlarge\nec2:\n  ami_family: oss-pytorch\n",
        "ec2.ami_family oss-pytorch: its NVIDIA driver cannot run p3.8xlarge's V100 GPUs; use ec2.ami_family "
        "proprietary-base",
    ),
    "an OSS-driver parameter for a V100": (
        "instance: p3.2xlarge\nec2:\n  ami_parameter: /aws/service/deeplearning/ami/x86_64/"
        "base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id\n",
        "an OSS-driver AMI cannot run p3.2xlarge's V100 GPUs",
    ),
    "an unknown AMI family": ("instance: g5.xlarge\nec2:\n  ami_family: mine\n", "ec2.ami_family 'mine' is unknown"),
    "an AMI id that is not one": ("instance: g5.xlarge\nec2:\n  ami_id: ubuntu\n", "is not an AMI id"),
    "both AMI keys": (
        "instance: g5.xlarge\nec2:\n  ami_id: ami-0123456789abcdef0\n  ami_parameter: /my/ami\n",
        "ami_id and ami_parameter both name the AMI",
    ),
    "a subnet that is not one": ("instance: g5.xlarge\nec2:\n  subnet_id: net-1\n", "not a subnet id"),
    "an unknown ec2 key": ("instance: g5.xlarge\nec2:\n  key_name: mine\n", "unknown key 'ec2.key_name'"),
    "a tiny root volume": ("instance: g5.xlarge\nec2:\n  volume_size_gb: 4\n", "ec2.volume_size_gb"),
}


@pytest.mark.parametrize("args, expected", REFUSALS.values(), ids=REFUSALS.keys())
def test_bad_input_is_refused_in_one_line_before_any_aws_call(capsys, args, expected):
    code, lines = run_cli(COMMON + args, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


@pytest.mark.parametrize("content, expected", SPEC_REFUSALS.values(), ids=SPEC_REFUSALS.keys())
def test_bad_ec2_specs_are_refused_in_one_line_before_any_aws_call(capsys, tmp_path, content, expected):
    job = tmp_path / "job.yaml"
    job.write_text(content)
    code, lines = run_cli(COMMON + [str(job)], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


def test_an_api_model_problem_names_the_flag():
    plan = dry()
    request = {**plan.request, "InstanceType": "g4dn.13xlarge", "Bogus": 1}
    with pytest.raises(UserError) as e:
        ec2.refuse_api_problems(request)
    message = str(e.value)
    assert message.startswith("EC2 would refuse this job, nothing was sent: ")
    assert "--instance: InstanceType 'g4dn.13xlarge' is not one of the values the API accepts" in message
    assert "Bogus is not a field of this request" in message


# ---------------------------------------------------------------- the CLI's dry run


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distrain_cloud.launcher.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_dry_run_opens_no_connection(tmp_path):
    """With credentials present and every endpoint a listening socket, nothing connects."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        env.update(
            HOME=str(tmp_path),
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{listener.getsockname()[1]}",
        )
        r = _cli(
            "submit", "--instance", "p4d.24xlarge", "--nodes", "2", "--region", "us-east-1", "--dry-run", "--json",
            env=env, cwd=tmp_path,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()
    plan = json.loads(r.stdout)
    assert plan["backend"] == "ec2" and plan["request"]["MinCount"] == 2
    assert plan["configs"]["user_data"][0] == "#!/bin/bash"


# ---------------------------------------------------------------- every plannable spec is a valid request


@functools.cache
def _bundle(root: Path, allow_large: tuple[str, ...]) -> bundle.Bundle:
    return _real_build(root, allow_large=allow_large)


_real_build = bundle.build_bundle
_name = st.from_regex(r"[a-z0-9](-?[a-z0-9]){0,20}", fullmatch=True)
_ec2_types = sorted(i.name for i in catalog.all_instances() if not i.sagemaker)
_specs = st.fixed_dictionaries(
    {
        "name": _name,
        "instance": st.sampled_from(_ec2_types),
        "nodes": st.one_of(st.integers(1, 4), st.integers(1, 64)),
        "strategy": st.sampled_from(["ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "single"]),
        "spot": st.booleans(),
        "max_run": st.integers(1, 40 * 86400),
        "stack": _name,
        "secrets": st.dictionaries(st.sampled_from(["HF_TOKEN", "WANDB_API_KEY"]), st.just(HF_REF), max_size=2),
        "hyperparameters": st.fixed_dictionaries(
            {}, optional={"lr": st.floats(1e-6, 1.0), "model": st.text(min_size=1, max_size=300)}
        ),
        "ec2": st.fixed_dictionaries(
            {},
            optional={
                "ami_id": st.from_regex(r"ami-[0-9a-f]{17}", fullmatch=True),
                "volume_size_gb": st.integers(8, 16384),
                "subnet_id": st.from_regex(r"subnet-[0-9a-f]{8}", fullmatch=True),
                "placement": st.booleans(),
                "efa": st.booleans(),
                "prefix": st.from_regex(r"[a-z0-9]{1,20}(/[a-z0-9]{1,20}){0,3}", fullmatch=True),
            },
        ),
    }
)


@pytest.mark.slow  # 60 generated specs, each planned: over 3 s under CI's load
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_specs)
def test_every_ec2_spec_that_plans_yields_a_request_the_api_accepts(monkeypatch, data):
    monkeypatch.setattr(bundle, "build_bundle", lambda root, allow_large=(): _bundle(root, tuple(allow_large)))
    try:
        plan = plan_job(load_spec(None, data), dry_run=True)
    except UserError:
        return  # refused before anything was sent: the other half of the contract
    assert apimodel.problems("ec2", "RunInstances", encoded(plan.request)) == []
    assert len(plan.request["UserData"].encode()) <= ec2_request.USER_DATA_LIMIT
    assert len(plan.request["ClientToken"]) <= 64
    assert not plan.failed_checks or all(c.name.startswith("cost") for c in plan.failed_checks)
