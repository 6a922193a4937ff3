"""The real CLI entry point, run in this process, for tests whose AWS is moto's in-process mock
(a subprocess would not see it; tests/conftest.py's `cli` fixture runs `distrain-cloud` as one)."""

from __future__ import annotations

import pytest

from distrain_cloud.launcher import cli


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `distrain-cloud ARGV`."""
    cli._TRAIN_ARGS.clear()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err
