"""Push a trained model folder to the Hugging Face Hub (`--push-to-hub REPO`, on `--hub-revision BRANCH`).

The token comes from HF_TOKEN at run time: the launcher resolves it from a secret
reference into the job's environment, so it never appears in a job spec or a plan.
"""

from __future__ import annotations

import os
from pathlib import Path

NO_TOKEN_MESSAGE = (
    "--push-to-hub REPO needs a Hugging Face token in HF_TOKEN at run time "
    "(the launcher resolves it from a secret reference)"
)


class HubPushError(RuntimeError):
    """A push that the Hub refused or that could not reach it; the token is redacted."""


def push_to_hub(
    folder: Path,
    repo_id: str,
    *,
    token: str | None = None,
    commit_message: str = "Upload model trained with distrain-cloud",
    private: bool | None = None,
    revision: str | None = None,
    endpoint: str | None = None,
) -> str:
    """Create the model repo `repo_id` if needed, then upload every file of `folder`.

    `revision` names the branch to commit to (None: main); a branch that is not there yet is
    created from main's head first, so a push to a new branch starts from the published model.

    Returns the commit URL, which ends with the commit oid (the last commit's: huggingface_hub
    splits folders of more than a few hundred files or 100 MB of small files into several).
    `endpoint` None means huggingface_hub's default: HF_ENDPOINT as it was when
    huggingface_hub was imported, else https://huggingface.co.
    """
    token = token or os.environ.get("HF_TOKEN")
    if not token:
        # Fail before any request: an anonymous push can only fail later, and less clearly.
        raise HubPushError(NO_TOKEN_MESSAGE)

    from huggingface_hub import HfApi

    # An explicit token also keeps huggingface_hub from falling back to a token file on disk.
    api = HfApi(endpoint=endpoint, token=token)
    failure = None
    try:
        api.create_repo(repo_id, exist_ok=True, repo_type="model", private=private)
        if revision not in (None, "main"):
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            repo_type="model",
            revision=revision,
            commit_message=commit_message,
        )
    except Exception as err:
        # huggingface_hub's messages quote the server's reply and URLs, not the token; a
        # misbehaving server or proxy could still echo it back, so redact it.
        # One line: huggingface_hub's messages run over several (the URL, then advice).
        failure = " ".join(f"{type(err).__name__}: {err}".split()).replace(token, "***")
    if failure is not None:
        # Raised outside the except block so that the original error is not chained:
        # its response object still holds the request and its Authorization header.
        where = f"{repo_id} (branch {revision})" if revision not in (None, "main") else repo_id
        raise HubPushError(f"Pushing {folder} to the Hub repo {where} failed: {failure}")

    # The caller says it (the trainer prints pushed_to_hub=REPO commit=URL with its other lines).
    return str(info.commit_url)


def kept_model_line(repo_id: str, folder: Path, env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """What to do after a failed push, for its error line: the model is saved, so the push alone
    is retried, never the training. A local job's folder is this machine's: `distrain-cloud push`
    retries it. A cloud job's is the node's, which goes when the job ends."""
    job = env.get("DISTRAIN_JOB_NAME") or env.get("TRAINING_JOB_NAME") or "JOB"
    if env.get("DISTRAIN_INSTANCE_TYPE") == "local":
        return f"the model is kept in {folder}: `distrain-cloud push {job}` retries the push alone, without retraining"
    return (
        f"the model was saved in {folder} on the node; push it from a copy of that folder with "
        f"`hf upload {repo_id} FOLDER` (`distrain-cloud push` retries local jobs only)"
    )
