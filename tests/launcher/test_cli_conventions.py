"""What people expect of a CLI: --version, -h on every command, "did you mean", cost notices."""

from __future__ import annotations

import os
import time
from importlib.metadata import version

import pytest

CLOUD_DRY_RUN = ["submit", "--instance", "ml.g5.xlarge", "--region", "us-east-1", "--dry-run"]


def test_version(cli, tmp_path):
    r = cli("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == f"distrain-cloud {version('distrain-cloud')}\n"


@pytest.mark.parametrize("command", [[], ["submit"], ["ls"], ["status"], ["resume"], ["infra"], ["infra", "up"]])
def test_dash_h_is_help_everywhere(cli, tmp_path, command):
    r = cli(*command, "-h", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("Usage: distrain-cloud"), r.stderr


def test_shell_completion_is_offered(cli, tmp_path):
    assert "--install-completion" in cli("--help", cwd=tmp_path).stdout


def test_a_typo_of_local_is_named(cli, tmp_path):
    r = cli("submit", "--instance", "locl", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["error: unknown instance type 'locl'; did you mean local? (this machine)"]


def test_a_cloud_job_on_the_default_limit_gets_a_cost_notice(cli, tmp_path):
    r = cli(*CLOUD_DRY_RUN, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "note: no --max-run given: the job may run 24 h (worst case $33.79); set --max-run, e.g. 2h"
    ]
    chosen = cli(*CLOUD_DRY_RUN, "--max-run", "2h", cwd=tmp_path)
    assert chosen.returncode == 0 and chosen.stderr == ""
    local = cli("submit", "--instance", "local", "--dry-run", cwd=tmp_path)
    assert local.returncode == 0 and local.stderr == ""


def test_status_and_ls_show_local_times_not_epoch_seconds(cli, tmp_path):
    root = tmp_path / "runs" / "job-1"
    root.mkdir(parents=True)
    (root / "job.json").write_text("{}")
    (root / "status.json").write_text('{"status": "Completed", "exit_code": 0, "updated": 1795703390.5}')
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1795703390.5))
    status = cli("status", "job-1", "--backend", "local", cwd=tmp_path)
    assert f"updated: {shown}\n" in status.stdout, status.stderr
    listing = cli("ls", "--backend", "local", cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert shown in listing.stdout, listing.stderr
