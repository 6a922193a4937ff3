"""The one module that touches boto3: clients, region, account, and error translation.

boto3 is imported inside functions so that importing this module stays cheap (the CLI
imports it for every command, including `--help`). Clients are created per call, never at
import time: credentials rotate, and tests install moto's mock before the first call.

AWS_ENDPOINT_URL (and the per-service AWS_ENDPOINT_URL_<SERVICE>) is honoured natively by
botocore >= 1.31, so `client()` passes no endpoint_url of its own. AWS_REGION is *not* read
by botocore (only AWS_DEFAULT_REGION and the profile are), so `region()` reads it itself.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
from collections.abc import Iterator
from typing import Any

from .errors import EXIT_CAPACITY, EXIT_CREDENTIALS, EXIT_PERMISSION, UserError

USER_AGENT = "distrain-cloud/0.1"
# botocore's `max_attempts` counts *retries*: 8 means up to 9 calls (total_max_attempts 9).
MAX_ATTEMPTS = 8

_NO_REGION = "no AWS region: pass --region or set AWS_REGION"
_ACCESS_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError"}
_QUOTA = {"ResourceLimitExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded", "ServiceQuotaExceededException"}
_THROTTLED = {"ThrottlingException", "Throttling", "RequestLimitExceeded", "TooManyRequestsException", "SlowDown"}
_VALIDATION = {"ValidationException", "ValidationError"}
_EXPIRED = {"ExpiredToken", "ExpiredTokenException", "RequestExpired"}
_BAD_CREDENTIALS = {
    "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "InvalidAccessKeyId",
}  # fmt: skip


def _config(max_attempts: int) -> Any:
    from botocore.config import Config

    return Config(retries={"mode": "standard", "max_attempts": max_attempts}, user_agent_extra=USER_AGENT)


@functools.lru_cache(maxsize=1)
def _loader() -> Any:
    # Service models are immutable JSON; sharing their loader saves ~0.3 s per client
    # while sessions (and so credentials) stay per call.
    from botocore.loaders import create_loader

    return create_loader()


def _configured_region() -> str | None:
    """AWS_REGION, then AWS_DEFAULT_REGION / the profile's region (botocore's own lookup)."""
    env = os.environ.get("AWS_REGION", "").strip()
    if env:
        return env
    import boto3
    from botocore.exceptions import ProfileNotFound

    try:
        return boto3.session.Session().region_name or None
    except ProfileNotFound as exc:  # AWS_PROFILE names a profile that is not there
        profile = exc.kwargs.get("profile")
        raise UserError(f"AWS profile {profile!r} not found: check AWS_PROFILE / ~/.aws/config") from exc


def client(service: str, region: str | None = None, *, max_attempts: int = MAX_ATTEMPTS) -> Any:
    """A new boto3 client for `service` with standard retries (8 retries, 9 calls by default)
    and our user agent. Advisory look-ups pass a small `max_attempts` so they never stall a plan.

    `region=None` falls back to the configured region (AWS_REGION included); global services
    (iam, sts, s3 without a region) also work with none at all."""
    import boto3
    import botocore.session

    core = botocore.session.Session()
    core.register_component("data_loader", _loader())
    name = region or _configured_region()
    return boto3.session.Session(botocore_session=core).client(service, region_name=name, config=_config(max_attempts))


@functools.lru_cache(maxsize=1)
def known_regions() -> frozenset[str]:
    """Every region botocore's bundled endpoint data knows for SageMaker or EC2 (offline)."""
    import boto3

    session = boto3.session.Session()
    known: set[str] = set()
    for partition in session.get_available_partitions():
        for service in ("sagemaker", "ec2"):
            known.update(session.get_available_regions(service, partition_name=partition))
    return frozenset(known)


def region(explicit: str | None) -> str:
    """The region to use: `explicit`, else AWS_REGION / AWS_DEFAULT_REGION / the profile's.

    Raises UserError when none is set or the name is not a region botocore knows."""
    name = (explicit or "").strip() or _configured_region()
    if not name:
        raise UserError(_NO_REGION)
    known = known_regions()
    if name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else "; e.g. us-east-1, us-west-2, eu-west-1"
        raise UserError(f"unknown AWS region {name!r}{hint} (a brand-new region may need a newer boto3)")
    return name


def account_id(region_name: str | None = None) -> str:
    """The AWS account id of the current credentials (STS GetCallerIdentity)."""
    with translate_errors():
        return str(client("sts", region_name).get_caller_identity()["Account"])


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_code(exc: Any) -> str:
    """The AWS error code of a botocore ClientError ("" for any other exception)."""
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))


def error_message(exc: Any) -> str:
    """The AWS error message of a botocore ClientError ("" for any other exception: a read
    timeout's `response` is None)."""
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Message", ""))


def _client_error(exc: Any) -> UserError:
    err = exc.response.get("Error", {})
    code, op = error_code(exc), exc.operation_name
    message = _one_line(re.split(r"\s*Encoded authorization failure message:", err.get("Message", ""))[0])
    if code in _ACCESS_DENIED:
        perm = re.search(r"perform:\s*([\w-]+:[\w*-]+)", message)
        missing = f"; missing permission {perm.group(1)}" if perm else ""
        return UserError(
            f"AWS denied {op}{missing}: grant it to your IAM user/role and retry", exit_code=EXIT_PERMISSION
        )
    if code in _QUOTA:
        return UserError(
            f"AWS quota exceeded for {op}: {message} -- request an increase in the Service Quotas console "
            "(or `aws service-quotas request-service-quota-increase`) for this region, "
            "or use a smaller instance type/count",
            exit_code=EXIT_CAPACITY,
        )
    if code in _THROTTLED:
        tries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) + 1
        return UserError(
            f"AWS is throttling {op} (gave up after {tries} attempts); retry later", exit_code=EXIT_CAPACITY
        )
    if code in _VALIDATION:
        return UserError(f"AWS rejected {op}: {message}")
    if code in _EXPIRED:
        return UserError(
            "AWS credentials have expired: refresh them (e.g. `aws sso login` or new session credentials) and retry",
            exit_code=EXIT_CREDENTIALS,
        )
    if code in _BAD_CREDENTIALS:
        return UserError(
            f"AWS rejected the credentials ({code}): check AWS_PROFILE / AWS_ACCESS_KEY_ID "
            "and run `aws sts get-caller-identity`",
            exit_code=EXIT_CREDENTIALS,
        )
    if code == "InsufficientInstanceCapacity":
        return UserError(
            f"AWS has no spare capacity for {op} right now: {message} -- try another availability zone, "
            "region or later",
            exit_code=EXIT_CAPACITY,
        )
    return UserError(f"AWS {op} failed ({code}): {message}")


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn botocore exceptions raised inside the block into one-line UserErrors.

    Messages name the operation and what to do; they never echo request parameters.
    Client-side bugs (ParamValidationError etc.) are left alone."""
    from botocore import exceptions as bx

    try:
        yield
    except (bx.NoCredentialsError, bx.PartialCredentialsError) as exc:
        raise UserError(
            "no AWS credentials found: run `aws configure` or set AWS_PROFILE / "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            exit_code=EXIT_CREDENTIALS,
        ) from exc
    except (bx.SSOTokenLoadError, bx.UnauthorizedSSOTokenError, bx.TokenRetrievalError) as exc:
        raise UserError(
            "AWS SSO session is missing or expired: run `aws sso login` and retry", exit_code=EXIT_CREDENTIALS
        ) from exc
    except bx.ProfileNotFound as exc:
        profile = exc.kwargs.get("profile")
        raise UserError(f"AWS profile {profile!r} not found: check AWS_PROFILE / ~/.aws/config") from exc
    except bx.NoRegionError as exc:
        raise UserError(_NO_REGION) from exc
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError) as exc:
        url = exc.kwargs.get("endpoint_url", "")
        raise UserError(
            f"cannot reach AWS endpoint {url}: check the region / network (proxy, VPN, AWS_ENDPOINT_URL)"
        ) from exc
    except bx.ClientError as exc:
        raise _client_error(exc) from exc


def configured() -> tuple[str | None, str]:
    """(the configured region, "") when AWS is set up enough to look something up, else (None,
    what is missing). Sends no AWS request (botocore's credential chain may ask an instance's
    metadata service, as any client would)."""
    from botocore.exceptions import BotoCoreError

    try:
        name = _configured_region()
        if not name:
            return None, "no AWS region is configured"
        import boto3

        credentials = boto3.session.Session().get_credentials()
    except (BotoCoreError, UserError) as e:  # a profile that is not there or does not parse
        return None, f"the AWS configuration could not be read: {_one_line(str(e), 200)}"
    return (name, "") if credentials is not None else (None, "no AWS credentials are configured")
