"""The CLI stays lean: --help and a dry run import no torch, transformers, sagemaker, boto3 or wandb."""

import json
import subprocess
import sys

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
    line = [l for l in r.stdout.splitlines() if l.startswith("MODULES=")]
    assert line, r.stdout + r.stderr
    return json.loads(line[0].removeprefix("MODULES="))


def test_importing_the_cli_imports_nothing_heavy(tmp_path):
    assert heavy_modules_after("", tmp_path) == []


def test_help_imports_nothing_heavy(tmp_path):
    action = "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass"
    assert heavy_modules_after(action, tmp_path) == []


def test_local_dry_run_imports_nothing_heavy(tmp_path):
    action = ("try:\n    cli.main(['submit', '--instance', 'local', '--dry-run', '--json'])\n"
              "except SystemExit as e:\n    assert e.code == 0, e.code")
    assert heavy_modules_after(action, tmp_path) == []
