"""What people expect of a CLI: --version, -h on every command, "did you mean", cost notices."""

from __future__ import annotations

import json
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
        "note: no --max-run given: the job may run 24 h (worst case $33.79, AWS list price as of 2025-07, recalled, "
        "not read from the Price List); set --max-run, e.g. 2h"
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
    os.utime(root / "job.json", (1795600000, 1795600000))  # submitted a day before it ended
    listing = cli("ls", "--backend", "local", cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1795600000))
    assert created in listing.stdout and shown not in listing.stdout, listing.stdout + listing.stderr


@pytest.mark.parametrize(
    "columns, name",
    [(80, "distrain-cloud-20261128-012345-abcdef"), (60, "a" * 20 + "-20261128-012345-abcdef" + "-b" * 10)],
    ids=["a-usual-name-in-80-columns", "the-longest-name-in-60-columns"],
)
def test_ls_never_cuts_a_job_name_and_shows_when_each_was_created(capsys, monkeypatch, tmp_path, columns, name):
    """The name is what users copy into the next command: whole on one line, the other columns
    wrapping to fit the terminal, and where even that cannot fit (SageMaker's 63 characters in
    60 columns), whole in a table wider than the terminal."""
    from clirun import run_cli

    names = [name, "short-1"]
    for created, name in zip((1795600000, 1795500000), names, strict=True):
        root = tmp_path / "runs" / name
        root.mkdir(parents=True)
        (root / "job.json").write_text("{}")
        status = {"status": "Failed", "exit_code": 1, "updated": 1795703390.5, "detail": "training exited " * 8}
        (root / "status.json").write_text(json.dumps(status))
        os.utime(root / "job.json", (created, created))
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "ls", "--backend", "local")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [n for n in names if any(n in line for line in lines)] == names, out
    assert out.index(names[0]) < out.index(names[1])  # the newest first, by creation
    if columns == 80:
        assert max(map(len, lines)) <= 80, out
    assert "training" in out and "1795" not in out


# Options both commands take whose values mean something else to export, by design: its secrets are
# the engine's own (not AWS references), and its dry run prints a manifest, not a plan.
_EXPORT_OWN = {"secret", "dry_run"}


def _described(param) -> dict:
    """What a person and click see of one parameter."""
    return {
        "opts": (tuple(param.opts), tuple(param.secondary_opts)),
        "type": param.type.to_info_dict(),  # its name, and choices where it has them
        "default": param.default,
        "help": getattr(param, "help", None),
        "metavar": param.metavar,
        "multiple": param.multiple,
        "is_flag": getattr(param, "is_flag", None),
    }


def test_submit_and_export_declare_their_shared_options_once():
    """export writes the job submit would run: each option both take is one declaration (cli.py's
    aliases), so its help cannot drift (export's --precision once lost fp8)."""
    import typer

    from distrain_cloud.launcher.cli import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    submit = {p.name: p for p in commands["submit"].params}
    export = {p.name: p for p in commands["export"].params}
    shared = sorted(set(submit) & set(export) - _EXPORT_OWN)
    assert len(shared) >= 20, shared
    for name in shared:
        assert _described(submit[name]) == _described(export[name]), name
    assert "fp8" in export["precision"].help
