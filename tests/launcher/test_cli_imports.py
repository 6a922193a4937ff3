"""The CLI stays lean: --help and a dry run import no torch, transformers, sagemaker, boto3 or wandb."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "sagemaker", "boto3", "botocore", "wandb", "accelerate", "datasets", "deepspeed")

PROBE = """
import json, sys
from distrain_cloud.launcher import cli
{action}
print("MODULES=" + json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def heavy_modules_after(action: str, cwd) -> list[str]:
    code = PROBE.format(action=action, heavy=HEAVY)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)
    line = [x for x in r.stdout.splitlines() if x.startswith("MODULES=")]
    assert line, r.stdout + r.stderr
    return json.loads(line[0].removeprefix("MODULES="))


def test_importing_the_cli_imports_nothing_heavy(tmp_path):
    assert heavy_modules_after("", tmp_path) == []


def test_help_imports_nothing_heavy(tmp_path):
    action = "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass"
    assert heavy_modules_after(action, tmp_path) == []


@pytest.mark.parametrize("train", [[], ["--", "--config-overrides", "n_layer=3"]], ids=["default", "overrides"])
def test_local_dry_run_imports_nothing_heavy(tmp_path, train):
    # --config-overrides are checked against the model's config by transformers in a process of
    # its own: the launcher's stays free of transformers and the torch it brings.
    action = (
        f"try:\n    cli.main(['submit', '--instance', 'local', '--dry-run', '--json', *{train!r}])\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code"
    )
    assert heavy_modules_after(action, tmp_path) == []


@pytest.mark.parametrize(
    "action",
    [
        "import distrain_cloud.launcher.catalog as c\n"
        "c.lookup('ml.p5.48xlarge'); c.hourly_price('p3.2xlarge', 'us-west-2')",
        "import distrain_cloud.launcher.catalog as c, distrain_cloud.launcher.backends.sagemaker.images as im\n"
        "if im.image_config_path():\n"
        "    im.choose_training_image(c.lookup('ml.p3.8xlarge'), 'us-east-1')",
    ],
    ids=["catalog", "images"],
)
def test_catalog_and_images_import_nothing_heavy(tmp_path, action):
    assert heavy_modules_after(action, tmp_path) == []


def test_export_dry_run_imports_nothing_heavy(tmp_path):
    action = (
        "try:\n    cli.main(['export', 'trainjob', '-a', 'A100:8', '--image', 'x', '--dry-run'])\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code"
    )
    assert heavy_modules_after(action, tmp_path) == []
