"""Every `--flag` a user can read in our messages is a flag they can type.

Errors, hints, check details and help text are string literals in launcher/, infra/ and
training/. Each `--name` in them must be an option of `distrain-cloud` (any command), of
`distrain-train`, or of one of our other entry points (the node launcher, the node agent);
otherwise a user who follows the advice gets "No such option".
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "infra", "training")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*)(?![\w-])")
# A backticked command of another program (`aws iam ... --user-name`): its flags are that program's.
QUOTED = re.compile(r"`[^`]*`")
OTHER_PROGRAMS = ("aws", "accelerate", "pip", "torchrun", "deepspeed", "nvidia-smi", "wandb", "hf", "git")
# Strings that look like flags of ours and are not.
NOT_OURS = {
    "--quiet": "pip install, in the job's bootstrap script",
    "--disable-pip-version-check": "pip install, in the job's bootstrap script",
    "--config_file": "accelerate launch, in the command the node launcher runs",
    "--num_cpu_threads_per_process": "accelerate launch, in the command the node launcher runs",
    "--query-gpu": "nvidia-smi, which the local backend asks for GPUs",
    "--format": "nvidia-smi, which the local backend asks for GPUs",
    "--ol-s3": "a suffix S3 reserves for bucket names",
    "--x-s3": "a suffix S3 reserves for bucket names",
    "--table-s3": "a suffix S3 reserves for bucket names",
}


def cli_options() -> set[str]:
    """Every option of every `distrain-cloud` command, and every `distrain-train` flag."""
    import click
    import typer.main

    from distrain_cloud.launcher.cli import app
    from distrain_cloud.training.args import build_parser

    def options(command: click.Command) -> set[str]:
        found = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                found |= options(sub)
        return found | {"--help"}

    training = {opt for action in build_parser()._actions for opt in action.option_strings}
    return options(typer.main.get_command(app)) | training


def argparse_flags(source: str) -> set[str]:
    """The flags an entry point defines with `add_argument("--name", ...)`."""
    return {
        arg.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--")
    }


def _ours(quoted: re.Match[str]) -> str:
    words = quoted.group(0).strip("`").split()
    return "" if words and words[0] in OTHER_PROGRAMS else quoted.group(0)


def named_flags(source: str) -> Iterator[tuple[int, str]]:
    """(line, --flag) for each flag named in a string literal, docstrings included (a command's
    docstring is its --help), and flags alone (("RoleArn", "--role") names what a refusal blames)."""
    tree = ast.parse(source)
    parts_of_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # read whole, with {} for what is filled in
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts_of_fstrings:
            text = node.value
        else:
            continue
        for match in FLAG.finditer(QUOTED.sub(_ours, text)):
            yield node.lineno, match.group(1)


def sources() -> dict[str, str]:
    return {
        str(path.relative_to(REPO)): path.read_text()
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }


def unknown_flags(files: dict[str, str], known: set[str]) -> list[str]:
    return [
        f"{name}:{line}: {flag}"
        for name, source in files.items()
        for line, flag in sorted(named_flags(source))
        if flag not in known and flag not in NOT_OURS
    ]


def test_every_flag_named_in_a_message_exists():
    files = sources()
    known = cli_options().union(*(argparse_flags(source) for source in files.values()))
    assert unknown_flags(files, known) == []


def test_a_message_naming_a_flag_that_does_not_exist_is_found():
    # the SageMaker images module once said --instance-type (the flag is --instance) and --transformers-version
    # (only the job-spec key sagemaker.transformers_version exists).
    source = """
def pick(instance):
    raise UserError(f"{instance} has no GPU; choose a GPU instance type (--instance-type, e.g. ml.g5.xlarge)")
HINT = f"pin it with --transformers-version {version} or `aws ecr describe-images --repository-name {name}`"
"""
    assert unknown_flags({"images.py": source}, cli_options()) == [
        "images.py:3: --instance-type",
        "images.py:4: --transformers-version",
    ]


def test_flags_of_other_programs_are_not_ours():
    source = """
DOC = "renders what `accelerate launch --config-file` reads; `--dry-run` prints it; after `--`, flags"
SOURCES = (("RoleArn", "--role"),)
PREFIX = "--no-"
"""
    assert sorted(named_flags(source)) == [(2, "--dry-run"), (3, "--role")]
    assert argparse_flags('p.add_argument("--job", required=True)') == {"--job"}
