"""The user paths, run from the built wheel with no checkout anywhere on the path.

What `pip install distrain-cloud` gives a user is a wheel: a file missing from its package data
(training/job_entry.sh once was) breaks every SageMaker job of an installed launcher while every
test of the checkout passes. So the wheel is built once per session (`pip wheel`, from a copy of
the source tree), installed into a fresh venv, and the user's commands run from that venv in an
empty folder:

- the quick start (`distrain-cloud submit --instance local`), a few steps;
- a SageMaker job: the plan's code bundle, built from site-packages, replayed with the request's
  own ContainerEntrypoint in a folder laid out like /opt/ml, by an "image" python that has the
  training stack but no distrain_cloud at all (what the bundle carries is all it gets);
- an EC2 job: `infra up` and `submit` against a moto server, then the instance's user data run as
  one node (tests/e2e/test_ec2_two_nodes.py's rehearsal, one node), which fetches the bundle and
  runs the node agent from it;
- `export skypilot` from the empty folder.

Both venvs reuse this venv's installed dependencies through a .pth line naming its site-packages:
a path a .pth file adds is not a site dir, so this venv's own .pth files (the editable install's
finder, which would map distrain_cloud to the checkout) are never run there; the test proves
`distrain_cloud.__path__` is the installed copy before anything else.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Tried to parse AWS:UserWarning"),  # infra up
]

REPO = Path(__file__).resolve().parents[2]
# Not part of what a wheel is built from: this checkout's own state.
_NOT_SOURCE = (".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "runs", "wandb", ".whl")
# Variables of this process that would change what the user's commands do.
_STRIPPED_PREFIXES = ("AWS_", "DISTRAIN_", "SM_", "WANDB_", "ACCELERATE_", "DS_", "TORCHELASTIC_", "PYTHON")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path  # the user's: the wheel installed, dependencies from this venv
    image: Path  # a job image's python: dependencies only, no distrain_cloud

    def bin(self, name: str, venv: Path | None = None) -> Path:
        return (venv or self.venv) / "bin" / name

    @property
    def python(self) -> Path:
        return self.bin("python")

    @property
    def image_python(self) -> Path:
        return self.bin("python", self.image)


def _venv(path: Path, wheel: Path | None) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    if wheel is not None:
        # Installed before the dependencies become visible: pip sees no other distrain-cloud.
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", wheel],
            check=True,
            timeout=300,
        )
    target = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(target) / "_test_venv_dependencies.pth").write_text("\n".join(ours) + "\n")
    return path


def _build_requirement_met() -> bool:
    """Whether this venv's setuptools satisfies pyproject's build requirement (then the wheel is
    built without an isolated build environment, which would fetch setuptools again)."""
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return False  # let pip build in its own environment
    from packaging.requirements import Requirement

    (text,) = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    requirement = Requirement(text)
    if importlib.util.find_spec("setuptools") is None:
        return False
    from importlib.metadata import version

    return requirement.specifier.contains(version("setuptools"))


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE), symlinks=True)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)]
    if _build_requirement_met():
        command.insert(-1, "--no-build-isolation")
    subprocess.run(command, check=True, timeout=300)
    (wheel,) = (root / "dist").glob("distrain_cloud-*.whl")
    return Installed(wheel, _venv(root / "user", wheel), _venv(root / "image", None))


def user_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED_PREFIXES)}
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        DISTRAIN_HOME=str(home / "distrain"),
        AWS_CONFIG_FILE=str(home / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(home / "hf"),
        WANDB_MODE="disabled",
        **extra,
    )
    return env


def run(argv: list, cwd: Path, env: dict[str, str], timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_installed_copy_is_what_runs(installed, tmp_path):
    probe = (
        "import json, distrain_cloud, distrain_cloud.launcher, distrain_cloud.training;"
        "from distrain_cloud.launcher.backends.cloud import repo_root;"
        "print(json.dumps({'path': list(distrain_cloud.__path__), 'launcher': distrain_cloud.launcher.__file__,"
        " 'root': str(repo_root())}))"
    )
    r = run([installed.python, "-c", probe], tmp_path, user_env(tmp_path / "home"))
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    site_packages = installed.venv.resolve()
    assert [Path(p).resolve().is_relative_to(site_packages) for p in found["path"]] == [True], found
    assert Path(found["launcher"]).resolve().is_relative_to(site_packages)
    root = Path(found["root"])
    assert not root.is_relative_to(REPO) and (root / "training" / "job_entry.sh").is_file()
    # The image sees the training stack but none of distrain_cloud.
    r = run([installed.image_python, "-c", "import torch, distrain_cloud"], tmp_path, user_env(tmp_path / "home"))
    assert "No module named 'distrain_cloud'" in r.stderr


def test_the_wheel_carries_every_file_of_the_packages(installed):
    """Every file git keeps under launcher/, training/, infra/ is in the wheel, and nothing else of
    the checkout (no tests, no bench)."""
    import zipfile

    tracked = subprocess.run(
        ["git", "ls-files", "launcher", "training", "infra"], cwd=REPO, capture_output=True, text=True
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    expected = {f"distrain_cloud/{path}" for path in tracked.stdout.split() if not path.endswith(".gitignore")}
    assert expected - names == set()
    packaged = {n for n in names if n.startswith("distrain_cloud/")}
    assert packaged - expected == set(), "files in the wheel that git does not keep"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_quick_start_from_an_empty_folder(installed, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    argv = [installed.bin("distrain-cloud"), "submit", "--instance", "local", "--json", "--"]
    argv += ["--max-steps", "4", "--log-every", "2", "--eval-every", "4", "--report-to", "none"]
    r = run(argv, folder, user_env(tmp_path / "home"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout)
    job = result["job_name"]
    model = folder / "runs" / job / "model"
    assert (model / "model.safetensors").is_file(), sorted(p.name for p in (folder / "runs").rglob("*"))


def _sagemaker_plan(installed: Installed, folder: Path, env: dict[str, str]) -> dict:
    """The plan of a SageMaker job made by the installed launcher (the code `submit --dry-run`
    runs), with its bundle written beside it."""
    script = (
        "import json, sys;"
        "from distrain_cloud.launcher.api import plan_job;"
        "from distrain_cloud.launcher.spec import load_spec;"
        "spec = load_spec(None, json.loads(sys.argv[1]));"
        "plan = plan_job(spec, dry_run=True);"
        "open('bundle.tar.gz', 'wb').write(plan.payload.bundle);"
        "print(json.dumps({'request': plan.request, 'sha256': plan.bundle['sha256']}))"
    )
    settings = {
        "instance": "ml.g5.xlarge",
        "region": "us-east-1",
        "precision": "no",
        "sagemaker": {"role": "arn:aws:iam::123456789012:role/sm"},
        "hyperparameters": {"task": "classification", "max_steps": 4, "log_every": 2, "report_to": "none"},
    }
    r = run([installed.python, "-c", script, json.dumps(settings)], folder, env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_sagemaker_job_of_the_installed_launcher_runs_from_its_bundle(installed, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    env = user_env(tmp_path / "home")
    # The repro: the dry run's bundle, from an empty folder, carries the job script.
    argv = [installed.bin("distrain-cloud"), "submit", "-i", "ml.g5.2xlarge", "--region", "us-east-1"]
    r = run([*argv, "--dry-run", "--bundle-files"], folder, env)
    assert r.returncode == 0, r.stderr
    assert "distrain_cloud/training/job_entry.sh" in r.stdout + r.stderr

    planned = _sagemaker_plan(installed, folder, env)
    request = planned["request"]
    root = tmp_path / "opt-ml"
    (root / "input" / "data" / "code").mkdir(parents=True)
    shutil.move(folder / "bundle.tar.gz", root / "input" / "data" / "code" / f"{planned['sha256']}.tar.gz")
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(request["HyperParameters"]))
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "inputdataconfig.json").write_text(json.dumps({c["ChannelName"]: {} for c in request["InputDataConfig"]}))
    # The container: the image's python first on PATH, SageMaker's folders, the request's variables.
    job_env = user_env(tmp_path / "job-home", DISTRAIN_SAGEMAKER_ROOT=str(root), **request["Environment"])
    job_env["PATH"] = os.pathsep.join([str(installed.image_python.parent), os.environ.get("PATH", "")])
    r = run(request["AlgorithmSpecification"]["ContainerEntrypoint"], tmp_path, job_env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"code={root / 'code' / 'distrain_cloud' / 'training'}" in r.stdout
    assert (root / "model" / "model.safetensors").is_file()
    metrics = (root / "output" / "data" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(m)["step"] for m in metrics if "train_loss" in m] == [2, 4]


def test_export_skypilot_from_an_empty_folder(installed, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    argv = [installed.bin("distrain-cloud"), "export", "skypilot", "-a", "A100-80GB:8", "--name", "wheel-check"]
    r = run([*argv, "--dry-run"], folder, user_env(tmp_path / "home"))
    assert r.returncode == 0, r.stderr
    task = yaml.safe_load(r.stdout)
    # No checkout to sync: the installed package folder is copied to the node, and setup installs
    # what the [train] extra names (read from the installed metadata), not the package from an index.
    assert "workdir" not in task, "an installed launcher has no checkout to sync"
    ((target, source),) = task["file_mounts"].items()
    assert target == "~/distrain-cloud/distrain_cloud"
    assert Path(source).resolve().is_relative_to(installed.venv.resolve()) and (Path(source) / "training").is_dir()
    assert "-e" not in task["setup"].split() and "'torch<2.15,>=2.4'" in task["setup"]
    assert task["run"].startswith("cd ~/distrain-cloud && python -m distrain_cloud.training.node_launch ")
    assert task["resources"]["accelerators"] == "A100-80GB:8"


def _two_node_rehearsal():
    """tests/e2e/test_ec2_two_nodes.py, by path (tests/e2e is not a package): its Rehearsal plays
    EC2 (moto server, one fake metadata service per node, the user data run with bash)."""
    spec = importlib.util.spec_from_file_location("ec2_rehearsal", Path(__file__).with_name("test_ec2_two_nodes.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_an_ec2_job_of_the_installed_launcher_boots_from_its_bundle(installed, tmp_path):
    """`infra up` and `submit` by the installed CLI from an empty folder, then the instance's user
    data run as one node whose python (the image's) has no distrain_cloud: the node agent and the
    training code come from the bundle the installed launcher built and uploaded."""
    import urllib.request

    from moto.server import ThreadedMotoServer

    ec2 = _two_node_rehearsal()
    cli_path, image_python = installed.bin("distrain-cloud"), installed.image_python

    class InstalledRehearsal(ec2.Rehearsal):
        def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
            home = self.root / "cli-home"
            env = user_env(
                home,
                AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="testing",
                AWS_REGION=ec2.REGION,
                AWS_ENDPOINT_URL=self.url,
            )
            return run([cli_path, *args], self.root, env, timeout=180)

        def node_env(self, imds: str, work: Path, instance_id: str, extra: dict[str, str]) -> dict[str, str]:
            env = super().node_env(imds, work, instance_id, extra)
            env["DISTRAIN_EC2_PYTHON"] = str(image_python)
            return env

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).read()
        folder = tmp_path / "empty"
        folder.mkdir()
        rehearsal = InstalledRehearsal(url, folder)
        (folder / "job.yaml").write_text(ec2.JOB_YAML.replace("nodes: 2", "nodes: 1"))
        flags = ["--max-steps", "4", "--save-every", "2", "--log-every", "1", "--report-to", "none"]
        job, instances = rehearsal.submit(*ec2.SUBMIT, "--", *flags)
        (node,) = rehearsal.run_nodes(instances)
        assert node.returncode == 0, node.output[-4000:]
        # The code that ran is the bundle's copy, unpacked by the user data, not any install.
        assert f"code={node.work / 'code' / 'distrain_cloud' / 'training'}" in node.output
        assert rehearsal.record(job, 0)["status"] == "Completed"
        assert sorted(rehearsal.losses(job)) == [1, 2, 3, 4]
        assert "model.safetensors" in rehearsal.keys(rehearsal.description(job)["model_uri"])
    finally:
        server.stop()
