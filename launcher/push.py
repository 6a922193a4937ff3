"""`distrain-cloud push JOB`: the Hub push of a job's kept model, alone, after a push that failed.

A push that fails (the Hub down, a token without write access) used to leave one way out:
`resume`, which retrains, from step 0 when the job kept no checkpoint, and then pushes again.
The model is saved before the push, so the push alone can be done again, from this machine.

Local jobs only: their model folder is here. A cloud job's model folder is the node's and goes
with it: a failed push fails the job, and EC2's node agent uploads a model only when training
completed (agent/node.py); whether SageMaker uploads model.tar.gz for a Failed job is not shown by
its documentation ("at the end of the training job") nor by moto, which runs no job. Training's
error line names `hf upload` for a cloud job instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from .plan import JobRef

# Written by training's save after the weights, the tokenizer and training_args.json: a folder
# with it holds a whole model.
MODEL_CARD = "README.md"


def push_job(ref: JobRef, *, repo: str | None = None, revision: str | None = None) -> str:
    """Push `ref`'s kept model to the repo it was to be pushed to (or `repo`), on the branch it
    named (or `revision`); return the line that says where it went."""
    from distrain_cloud.training.args import branch_problem, repo_id_problem
    from distrain_cloud.training.hub import HubPushError, push_to_hub

    if ref.backend != "local":
        raise UserError(
            f"{ref.name} is a {ref.backend} job: `distrain-cloud push` retries local jobs, whose model folder is on "
            "this machine; a cloud job's model folder is its node's (its error line says how to push a copy with "
            "`hf upload`)"
        )
    model = (ref.workdir / ref.name / "model").resolve()
    if not (model / "config.json").is_file() or not (model / MODEL_CARD).is_file():
        raise UserError(
            f"{ref.name} kept no whole model in {model} (training did not finish saving it): nothing to push; "
            f"`distrain-cloud resume {ref.name}` continues its training from the last checkpoint"
        )
    asked = _training_args(model)  # the job's flags, unless given here: each checked, from a file
    flag = "--repo" if repo else "the job's --push-to-hub"
    repo = repo or _text(asked.get("push_to_hub"))
    if not repo:
        raise UserError(f"{ref.name} was not asked to push to the Hub: name the repo with --repo REPO")
    problem = repo_id_problem(repo)
    if problem:
        raise UserError(f"{flag} {repo!r} is not a Hub repo id: {problem}")
    flag = "--revision" if revision else "the job's --hub-revision"
    revision = revision or _text(asked.get("hub_revision"))
    problem = branch_problem(revision) if revision else None
    if problem:
        raise UserError(f"{flag} {revision!r}: {problem}")
    token = os.environ.get("HF_TOKEN") or _token(ref.name)
    private = asked.get("hub_private") is True or None
    try:
        url = push_to_hub(model, repo, token=token, private=private, revision=revision)
    except HubPushError as e:
        raise UserError(f"{e}; run `distrain-cloud push {ref.name}` again once that is fixed") from None
    branch = f" (branch {revision})" if revision not in (None, "main") else ""
    return f"pushed {model} to the Hub repo {repo}{branch}: {url}"


def _training_args(model: Path) -> dict[str, Any]:
    """The flags training ran with, as it wrote them beside the model (a file: read with care)."""
    try:
        with open(model / "training_args.json", "rb") as f:
            loaded = json.loads(f.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _token(job: str) -> str:
    """The token to push with where HF_TOKEN is not set: the job's own (its secret reference),
    else the one `hf auth login` stored here; a reference that cannot be resolved (no AWS
    credentials here) yields to a stored login, and is named when there is none."""
    try:
        token, problem = _token_from_secret(job), None
    except UserError as e:
        token, problem = None, str(e)
    token = token or _logged_in_token()
    if not token:
        raise UserError(
            f"pushing {job}'s model needs a Hugging Face token with write access: set HF_TOKEN in this "
            "environment or log in with `hf auth login`" + (f" ({problem})" if problem else "")
        )
    return token


def _logged_in_token() -> str | None:
    """The token `hf auth login` stored on this machine (this is the user's machine, not a job's)."""
    from huggingface_hub import get_token

    return get_token()


def _token_from_secret(job: str) -> str | None:
    """The token the job itself used, where its spec named it by reference (`--secret HF_TOKEN=REF`):
    resolved here as the job's wrapper resolved it, never printed."""
    from distrain_cloud.infra.secret_env import resolve

    from .jobs import read_record

    secrets = ((read_record(job) or {}).get("spec") or {}).get("secrets") or {}
    ref = secrets.get("HF_TOKEN") if isinstance(secrets, dict) else None
    return resolve(ref, "HF_TOKEN") if isinstance(ref, str) else None
