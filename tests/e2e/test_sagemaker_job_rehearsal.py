"""Rehearse a SageMaker job on this machine: the planned request's own entrypoint, run
against a folder laid out like /opt/ml, trains with the code from the uploaded bundle.

SageMaker gives the container: the `code` channel (our bundle), hyperparameters.json (the
request's HyperParameters), resourceconfig.json and inputdataconfig.json. Everything else
(unpacking, requirements, secrets wrapper, node launcher, the contract read from those
files) is ours, and runs here exactly as it is in the request.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.spec import load_spec

pytestmark = pytest.mark.slow


def test_the_planned_entrypoint_trains_from_the_bundle(tmp_path, no_aws_config):
    spec = load_spec(
        None,
        {
            "instance": "ml.g5.xlarge",
            "region": "us-east-1",
            "precision": "no",
            "sagemaker": {"role": "arn:aws:iam::123456789012:role/sm"},
            "hyperparameters": {"task": "classification", "max_steps": 6, "log_every": 2, "report_to": "none"},
        },
    )
    plan = plan_job(spec, dry_run=True)
    request = plan.request

    root = tmp_path / "opt-ml"
    (root / "input" / "data" / "code").mkdir(parents=True)
    (root / "input" / "data" / "code" / f"{plan.bundle['sha256']}.tar.gz").write_bytes(plan.payload.bundle)
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(request["HyperParameters"]))
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "inputdataconfig.json").write_text(json.dumps({c["ChannelName"]: {} for c in request["InputDataConfig"]}))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTRAIN_", "SM_", "WANDB_"))}
    env.update(
        request["Environment"],
        # The image's python (torch, transformers, accelerate) is this venv's: first on PATH, as the
        # entrypoint's `python` must find it whether or not the venv was activated (without it, a
        # bare python tried to install the requirements and found no accelerate).
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        DISTRAIN_SAGEMAKER_ROOT=str(root),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
    )
    entry = request["AlgorithmSpecification"]["ContainerEntrypoint"]
    r = subprocess.run(entry, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # The code that ran is the bundle's copy, unpacked by the entrypoint.
    assert f"code={root / 'code' / 'distrain_cloud' / 'training'}" in r.stdout
    # SageMaker's folders: the model, metrics under output/data, checkpoints where S3 syncs.
    assert (root / "model" / "model.safetensors").is_file()
    metrics = [json.loads(line) for line in (root / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "train_loss" in m] == [2, 4, 6]
    assert any("eval_accuracy" in m for m in metrics)
    # The metric regexes of the request match what the job printed.
    import re

    for definition in request["AlgorithmSpecification"]["MetricDefinitions"]:
        if definition["Name"] in ("train_loss", "eval_accuracy"):
            assert re.search(definition["Regex"], r.stdout), definition
