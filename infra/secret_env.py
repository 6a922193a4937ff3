"""Resolve secret references into environment variables, then run the job's command.

    DISTRAIN_SECRETS='{"HF_TOKEN": "arn:aws:secretsmanager:..."}' \
        python -m distrain_cloud.infra.secret_env -- python -m distrain_cloud.training.node_launch ...

This runs inside the job (it ships in the code bundle), so requests, hyperparameters and
job descriptions only ever hold references. Training code never imports it: it just finds
HF_TOKEN / WANDB_API_KEY in its environment.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence

from .errors import UserError

# What a reference looks like, for the spec (which refuses anything else before a job exists)
# and for the job: a Secrets Manager or SSM ARN, ssm:/name, or secretsmanager:name.
REFERENCE = re.compile(r"^(arn:aws[\w-]*:(secretsmanager|ssm):[\w-]+:\d{12}:.+|ssm:/.+|secretsmanager:.+)$")


def parse_reference(ref: str) -> tuple[str, str, str | None]:
    """-> (service, id, region) for 'arn:aws:secretsmanager:...', 'arn:aws:ssm:...:parameter/x',
    'ssm:/name' or 'secretsmanager:name'."""
    if not REFERENCE.match(ref):
        raise UserError("not a secret reference (use a Secrets Manager or SSM ARN, ssm:/name or secretsmanager:name)")
    if ref.startswith("arn:"):
        parts = ref.split(":", 6)
        service, region = parts[2], parts[3]
        if service == "ssm":
            return "ssm", "/" + parts[5].removeprefix("parameter/").lstrip("/"), region
        return service, ref, region
    service, _, ident = ref.partition(":")
    return service, ident, None


def resolve(ref: str, env_name: str, client_factory: Callable | None = None) -> str:
    from .aws import client as make_client
    from .aws import error_code

    factory = client_factory or make_client
    service, ident, region = parse_reference(ref)
    try:
        if service == "ssm":
            return str(factory("ssm", region).get_parameter(Name=ident, WithDecryption=True)["Parameter"]["Value"])
        value = str(factory("secretsmanager", region).get_secret_value(SecretId=ident)["SecretString"])
    except UserError:
        raise
    except Exception as e:  # one line naming the variable and reference, never a value
        code = error_code(e) or type(e).__name__
        raise UserError(f"cannot resolve {env_name} from {ref}: {code}") from None
    # A JSON secret holding several keys: take the one named like the variable.
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    if isinstance(parsed, dict) and env_name in parsed:
        return str(parsed[env_name])
    return value


def resolve_all(refs: Mapping[str, str], client_factory: Callable | None = None) -> dict[str, str]:
    return {name: resolve(ref, name, client_factory) for name, ref in refs.items()}


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        sys.exit("usage: python -m distrain_cloud.infra.secret_env -- COMMAND ...")
    refs = json.loads(os.environ.pop("DISTRAIN_SECRETS", "{}") or "{}")
    try:
        os.environ.update(resolve_all(refs))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    if refs:
        print(f"secrets resolved into: {', '.join(sorted(refs))}", flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
