"""`distrain-cloud export skypilot|trainjob|pytorchjob` (launcher/export.py), through the real CLI.

What it writes passes the engines' own schema or types: SkyPilot's task schema (with its resources
and bucket-mount schemas), vendored in tests/data/engines/ from skypilot 0.14.1 with its commit
(vendor_schemas.py writes it), which `sky.Task.from_yaml` validates a task with; a TrainJob read by
Kubeflow Trainer's API models (kubeflow-trainer-api 2.3.0) and a PyTorchJob by the training
operator's SDK (kubeflow-training 1.9.4, with the Kubernetes client's pod types), each written back
unchanged: a field they do not know (which the API server would prune) is an error here.
The loopback run of each export is in tests/training/test_export_run.py.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from clirun import run_cli

ENGINES_DATA = Path(__file__).parents[1] / "data" / "engines"
GPU_FLAGS = ["--accelerator", "A100:8", "--nodes", "2"]
TRAIN = ["--", "--task", "causal-lm", "--preset", "tiny-gpt2", "--max-steps", "200"]
IMAGE = ["--image", "registry.example.com/team/distrain-cloud:0.1"]


def schema(name: str) -> dict[str, Any]:
    return json.loads((ENGINES_DATA / f"{name}.schema.json").read_text())


def differences(sent: Any, kept: Any, path: str = "") -> list[str]:
    """Where `kept` (a manifest read by an engine's own types and written back) is not `sent`: a field
    the types do not know is dropped there, as the API server prunes it."""
    if isinstance(sent, dict) and isinstance(kept, dict):
        found = [f"{path}.{k}: unknown field" for k in sent if k not in kept]
        return found + [d for k in sent if k in kept for d in differences(sent[k], kept[k], f"{path}.{k}")]
    if isinstance(sent, list) and isinstance(kept, list) and len(sent) == len(kept):
        return [d for i, (a, b) in enumerate(zip(sent, kept, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if sent == kept else [f"{path}: {sent!r} read as {kept!r}"]


def read_back(document: dict[str, Any], engine: str) -> dict[str, Any]:
    """`document` read by the engine's own Python types and written back: Kubeflow Trainer's API
    models (kubeflow-trainer-api, generated from the same release's OpenAPI) for a TrainJob; the
    training operator's SDK (kubeflow-training, with the Kubernetes client's pod types) for a
    PyTorchJob. Either raises on a wrong type or a missing required field."""
    if engine == "trainjob":
        from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

        job = TrainerV1alpha1TrainJob.from_dict(document)
        assert job is not None
        return job.to_dict()
    from kubeflow.training import ApiClient

    class Response:  # what ApiClient.deserialize reads
        data = json.dumps(document)

    client = ApiClient()
    return client.sanitize_for_serialization(client.deserialize(Response(), "KubeflowOrgV1PyTorchJob"))


def problems(document: dict[str, Any], engine: str) -> list[str]:
    from jsonschema import Draft202012Validator

    if engine == "skypilot":
        vendored = schema("skypilot-task")
        found = list(Draft202012Validator(vendored["schema"]).iter_errors(document))
        found += Draft202012Validator(vendored["resources_schema"]).iter_errors(document.get("resources", {}))
        for mount in document.get("file_mounts", {}).values():
            if not isinstance(mount, str):  # a string is a folder of this machine, copied as it is
                found += Draft202012Validator(vendored["storage_schema"]).iter_errors(mount)
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in found]
    try:
        return differences(document, read_back(document, engine))
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        return [f"{type(e).__name__}: {e}"]


def export(capsys, engine: str, *flags: str) -> tuple[int, str, str]:
    return run_cli(capsys, "export", engine, *flags)


def dry_run(capsys, engine: str, *flags: str) -> tuple[dict[str, Any], str]:
    code, out, err = export(capsys, engine, "--dry-run", *flags)
    assert code == 0, err
    return yaml.safe_load(out), out


CASES = [
    ("skypilot", [*GPU_FLAGS, "--spot", "--checkpoints", "s3://my-bucket/ckpt", "--secret", "HF_TOKEN"]),
    ("skypilot", ["--accelerator", "cpu", "--processes", "2", "--nodes", "2", *IMAGE, "--region", "eu-west-1"]),
    (
        "trainjob",
        [*GPU_FLAGS, *IMAGE, "--checkpoints", "pvc:shared", "--secret", "HF_TOKEN=hf/token", "--max-run", "6h"],
    ),
    ("trainjob", ["--accelerator", "cpu", "--processes", "2", "--nodes", "2", *IMAGE]),
    ("pytorchjob", [*GPU_FLAGS, *IMAGE, "--checkpoints", "pvc:shared", "--secret", "WANDB_API_KEY", "--max-run", "6h"]),
    ("pytorchjob", ["--accelerator", "cpu", "--processes", "2", "--nodes", "2", *IMAGE]),
]


@pytest.mark.parametrize("engine, flags", CASES, ids=[f"{e}-{'gpu' if 'A100:8' in f else 'cpu'}" for e, f in CASES])
def test_each_export_passes_the_engines_own_schema(capsys, engine, flags):
    document, _ = dry_run(capsys, engine, *flags, *TRAIN)
    assert problems(document, engine) == []


def test_the_schemas_catch_what_they_should(capsys):
    """The checks above are not vacuous: a misspelt field fails each engine's schema."""
    sky, _ = dry_run(capsys, "skypilot", *GPU_FLAGS)
    assert problems({**sky, "num_node": 2}, "skypilot")
    assert problems({**sky, "resources": {"accelerator": "A100:8"}}, "skypilot")
    for engine in ("trainjob", "pytorchjob"):
        kube, _ = dry_run(capsys, engine, *GPU_FLAGS, *IMAGE)
        assert problems({**kube, "spec": {**kube["spec"], "numNodes": 2}}, engine)  # not a spec field
    trainjob, _ = dry_run(capsys, "trainjob", *GPU_FLAGS, *IMAGE)
    trainjob["spec"]["trainer"]["numProcPerNode"] = "eight"
    assert problems(trainjob, "trainjob")  # not an integer
    pytorchjob, _ = dry_run(capsys, "pytorchjob", *GPU_FLAGS, *IMAGE)
    del pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"]
    assert problems(pytorchjob, "pytorchjob")  # a container needs a name


def node_command(document: dict[str, Any], engine: str) -> list[str]:
    if engine == "skypilot":
        return shlex.split(document["run"])
    if engine == "trainjob":
        return document["spec"]["trainer"]["command"]
    return document["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]


def test_the_same_entry_point_and_flags_as_submit_with_precision_resolved_for_the_accelerator(capsys, tmp_path):
    for engine in ("skypilot", "trainjob", "pytorchjob"):
        for accelerator, precision in (("A100:8", "bf16"), ("V100:4", "fp16"), ("cpu", "no")):
            document, text = dry_run(capsys, engine, "--accelerator", accelerator, *IMAGE, *TRAIN)
            command = node_command(document, engine)
            name = document["name"] if engine == "skypilot" else document["metadata"]["name"]
            # SkyPilot runs on the accelerator named; a Kubernetes pod gets any GPU model the cluster
            # has (nvidia.com/gpu), so its node picks the precision for the GPU it gets.
            picked = engine != "skypilot" and accelerator != "cpu"
            assert command == [
                *("python", "-m", "distrain_cloud.training.node_launch", "--"),
                *("--strategy", "auto", *(() if picked else ("--precision", precision))),
                *("--wandb-project", "distrain-cloud", "--run-name", name),
                *TRAIN[1:],
            ], command
            said = f"the node's pick for its GPUs ({precision} on {accelerator.split(':')[0]})" if picked else precision
            assert text.startswith(f"# distrain-cloud export {engine}: {name}\n# precision {said}, strategy ")
    # A catalog instance type stands for its GPUs: submit's own resolution (fp16 on T4s).
    document, _ = dry_run(capsys, "skypilot", "--instance", "g4dn.12xlarge", *IMAGE)
    assert "fp16" in node_command(document, "skypilot")
    # A precision asked for is kept on every engine.
    document, _ = dry_run(capsys, "pytorchjob", "--instance", "g4dn.12xlarge", "--precision", "fp16", *IMAGE)
    assert document["spec"]["nprocPerNode"] == "4"
    assert "fp16" in node_command(document, "pytorchjob")


def test_secrets_are_references_and_checkpoints_shared(capsys):
    sky, text = dry_run(capsys, "skypilot", *GPU_FLAGS, "--checkpoints", "s3://my-bucket/c", "--secret", "HF_TOKEN")
    assert sky["secrets"] == {"HF_TOKEN": None}  # given at launch: sky launch --secret HF_TOKEN
    assert "--secret HF_TOKEN" in text.splitlines()[2]
    assert sky["file_mounts"] == {"/distrain-job": {"source": "s3://my-bucket/c", "mode": "MOUNT_CACHED"}}
    # Checkpoints, the model and the outputs all land in the bucket, in the job's own folder: a
    # spot job's results outlive its cluster, and no job writes over another's.
    for variable, folder in (("CHECKPOINT", "checkpoints"), ("MODEL", "model"), ("OUTPUT", "output")):
        assert sky["envs"][f"DISTRAIN_{variable}_DIR"] == f"/distrain-job/{sky['name']}/{folder}"
    # The code: this checkout (an editable install), synced from wherever export ran.
    assert Path(sky["workdir"]) == Path(__file__).parents[2] and "pip install -e" in sky["setup"]
    job, _ = dry_run(capsys, "pytorchjob", *GPU_FLAGS, *IMAGE, "--checkpoints", "pvc:shared", "--secret", "HF_TOKEN")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)
    # Bad input (exit 2) fails the job; a stop or a killed process (128 + signal) restarts the pod.
    assert replicas["Worker"]["restartPolicy"] == "ExitCode"
    pod = replicas["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "value"}}} in container["env"]
    assert pod["volumes"] == [{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DISTRAIN_CHECKPOINT_DIR"].startswith("/shared/")
    # The operator's rendezvous port: on the container and port name it looks for.
    assert (container["name"], container["ports"][0]["name"]) == ("pytorch", "pytorchjob-port")


@pytest.mark.parametrize(
    "engine, flags, error",
    [
        ("trainjob", ["--spot"], "error: --spot: spot capacity is the cluster's node pools' business"),
        ("pytorchjob", ["--region", "us-east-1"], "error: --region: the cluster is where the job runs"),
        ("skypilot", ["--max-wait", "2h", "--spot", "--max-run", "1h"], "error: --max-wait: "),
        ("skypilot", ["--max-run", "1h"], "error: --max-run: a wall-clock limit on the job (skypilot cannot"),
        ("skypilot", ["--max-cost", "5"], "error: --max-cost: a budget"),
        ("trainjob", ["--resume-from", "distrain-1"], "error: --resume-from: "),
        ("skypilot", ["--input", "train=/home/me/data"], "error: --input train=/home/me/data: a path on this machine"),
        ("trainjob", ["--input", "train=s3://my-bucket/d"], "error: --input: a data channel needs a volume"),
        ("pytorchjob", [], "error: pytorchjob needs --image IMAGE"),
        ("skypilot", ["--secret", "HF_TOKEN=hf_abc"], "error: --secret HF_TOKEN=...: SkyPilot takes the name alone"),
        ("trainjob", ["--secret", "HF_TOKEN=no-key"], "error: --secret HF_TOKEN=...: give SECRET/KEY"),
        (
            "trainjob",
            ["--checkpoints", "s3://my-bucket/c"],
            "error: --checkpoints s3://my-bucket/c: trainjob takes pvc:CLAIM",
        ),
        ("skypilot", ["--push-to-hub", "me/model"], "error: --push-to-hub me/model needs a Hub token: add --secret"),
        ("skypilot", ["--accelerator", "B300:8"], "error: --accelerator B300:8: unknown GPU 'B300'"),
        ("skypilot", ["--accelerator", "A100-60GB:8"], "error: --accelerator A100-60GB:8: A100 comes with A100-40GB"),
        ("skypilot", ["--spot"], "error: --spot: a SkyPilot managed spot job restarts on a new cluster"),
        ("skypilot", ["--name", "1st-try"], "error: --name 1st-try: skypilot needs a name of lowercase letters"),
        ("trainjob", ["--name", "2024-run"], "error: --name 2024-run: trainjob needs a name of lowercase letters"),
        ("pytorchjob", [*IMAGE, "--name", "9lives"], "error: --name 9lives: pytorchjob needs a name"),
        ("nomad", [], "error: unknown engine 'nomad'; choose one of: skypilot, trainjob, pytorchjob"),
    ],
)
def test_what_an_engine_cannot_express_is_refused_in_one_line(capsys, tmp_path, monkeypatch, engine, flags, error):
    monkeypatch.chdir(tmp_path)
    hardware = [] if "--accelerator" in flags else ["--accelerator", "A100:8"]
    image = IMAGE if engine == "trainjob" else []
    code, out, err = export(capsys, engine, *hardware, *image, *flags)
    assert code != 0 and out == ""
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith(error), err
    assert list(tmp_path.iterdir()) == []


def test_a_secret_in_the_spec_is_an_aws_reference_no_engine_resolves(capsys, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("secrets:\n  HF_TOKEN: ssm:/team/hf-token\n")
    code, _, err = export(capsys, "skypilot", str(spec), "--accelerator", "L4:4")
    assert code != 0 and err.strip() == (
        "error: secrets: HF_TOKEN name AWS references, which skypilot does not resolve; give --secret NAME instead "
        "(the engine's own secret)"
    )


def test_without_dry_run_the_manifest_is_written_with_the_command_that_starts_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = export(capsys, "trainjob", "--accelerator", "L4:4", *IMAGE, *TRAIN)
    assert code == 0
    (written,) = tmp_path.iterdir()
    assert written.name.endswith(".trainjob.yaml")
    assert out == f"wrote {written.name}\nstart it: kubectl apply -f {written.name}\n"
    assert problems(yaml.safe_load(written.read_text()), "trainjob") == []


def test_the_vendored_schema_names_its_source():
    assert schema("skypilot-task")["source"].startswith("skypilot 0.14.1 (PyPI; commit ")


@pytest.mark.parametrize(
    "hardware, accelerators",
    [
        (["--accelerator", "A100-80GB:8"], "A100-80GB:8"),  # SkyPilot's A100 is the 40 GB part
        (["--accelerator", "A100:8"], "A100:8"),
        (["--accelerator", "V100-32GB:8"], "V100-32GB:8"),
        (["--instance", "p4de.24xlarge"], "A100-80GB:8"),
        (["--instance", "p3dn.24xlarge"], "V100-32GB:8"),
        (["--instance", "p4d.24xlarge"], "A100:8"),
        (["--instance", "g5.12xlarge"], "A10G:4"),
    ],
)
def test_skypilot_gets_the_gpu_memory_the_plan_assumed(capsys, hardware, accelerators):
    sky, text = dry_run(capsys, "skypilot", *hardware, *TRAIN)
    assert sky["resources"]["accelerators"] == accelerators
    assert problems(sky, "skypilot") == []


@pytest.mark.parametrize("layers, noted", [([], False), (["--", "--fp8-linear", "torchao"], True)])
def test_an_export_on_torchaos_float8_layers_notes_the_image_must_carry_torchao(capsys, layers, noted):
    """As the cloud plans do: no job installs torchao, so its float8 layers need an image with it."""
    code, _, err = export(capsys, "skypilot", "--dry-run", "--accelerator", "H100:8", "--precision", "fp8", *layers)
    assert code == 0, err
    note = "note: torchao in the job's image: torchao's float8 layers need it and no job installs it"
    assert (note in err) is noted, err


def test_a_name_is_one_every_engine_takes(capsys):
    for engine in ("skypilot", "trainjob", "pytorchjob"):
        document, _ = dry_run(capsys, engine, "--accelerator", "L4:1", "--name", "Run-42", *IMAGE)
        name = document["name"] if engine == "skypilot" else document["metadata"]["name"]
        assert name.startswith("run-42-") and problems(document, engine) == [], name
