"""Small idempotent AWS helpers the backends need: buckets, roles, content-addressed uploads.

Each is a plain function with explicit arguments; each creates its clients through
`infra.aws.client` and turns AWS errors into one-line UserErrors.
"""

from __future__ import annotations

import enum
import json
import urllib.parse
from typing import Any

from . import aws
from .errors import UserError


def _bucket_region(s3: Any, name: str) -> str:
    location = s3.get_bucket_location(Bucket=name).get("LocationConstraint")
    return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, str(location))


class BucketAccess(str, enum.Enum):
    """What HeadBucket says about a bucket name."""

    OURS = "ours"  # it exists and we may use it
    MISSING = "missing"  # no bucket of that name: it can be created
    DENIED = "denied"  # S3's 403: another account's bucket, or one whose policy denies us


def bucket_access(s3: Any, name: str) -> BucketAccess:
    """HeadBucket on `name`, interpreted; any other AWS error is raised as it came."""
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=name)
    except ClientError as exc:
        code = aws.error_code(exc)
        if code in ("403", "AccessDenied"):
            return BucketAccess.DENIED
        if code in ("404", "NoSuchBucket"):
            return BucketAccess.MISSING
        raise
    return BucketAccess.OURS


def default_bucket(account: str, region: str) -> str:
    """The name of the per-account, per-region default bucket (not created; see ensure_bucket)."""
    return f"distrain-cloud-{account}-{region}"


def ensure_bucket(name: str, region: str) -> str:
    """Make sure bucket `name` exists in `region` and is ours; returns the name.

    A new bucket gets the right LocationConstraint, all public access blocked and SSE-S3
    default encryption. An existing bucket is left as it is, but must be accessible to us
    and live in `region` (SageMaker reads its inputs from the job's region)."""
    from botocore.exceptions import ClientError

    s3 = aws.client("s3", region)
    with aws.translate_errors():
        access = bucket_access(s3, name)
        if access is BucketAccess.DENIED:
            raise UserError(
                f"S3 bucket {name!r} exists but belongs to another account (or denies you access): "
                "choose another bucket name"
            )
        if access is BucketAccess.OURS:
            actual = _bucket_region(s3, name)
            if actual != region:
                raise UserError(f"S3 bucket {name!r} is in {actual}, not {region}: use a bucket in the job's region")
            return name

        kwargs: dict[str, Any] = {"Bucket": name}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            s3.create_bucket(**kwargs)
        except ClientError as exc:
            if aws.error_code(exc) == "BucketAlreadyExists":
                raise UserError(
                    f"S3 bucket name {name!r} is taken by another account: choose another bucket name"
                ) from exc
            if aws.error_code(exc) != "BucketAlreadyOwnedByYou":  # lost a race with ourselves: fine
                raise
        s3.put_public_access_block(
            Bucket=name,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        )
        s3.put_bucket_encryption(
            Bucket=name,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
        )
    return name


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _trusts(policy: Any, principal: str) -> bool:
    if isinstance(policy, str):  # the raw API returns URL-encoded JSON; boto3 usually decodes it
        policy = json.loads(urllib.parse.unquote(policy))
    for statement in _as_list(policy.get("Statement", [])):
        actions = {a.lower() for a in _as_list(statement.get("Action", []))}
        if statement.get("Effect") != "Allow" or not actions & {"sts:assumerole", "sts:*", "*"}:
            continue
        who = statement.get("Principal", {})
        if who == "*" or principal in _as_list(who.get("Service", []) if isinstance(who, dict) else []):
            return True
    return False


def check_role(
    role_arn_or_name: str, service_principal: str = "sagemaker.amazonaws.com", region: str | None = None
) -> str:
    """The ARN of IAM role `role_arn_or_name` after checking it exists in this account and
    that its trust policy lets `service_principal` assume it."""
    from botocore.exceptions import ClientError

    name = role_arn_or_name.rsplit("/", 1)[-1] if role_arn_or_name.startswith("arn:") else role_arn_or_name
    with aws.translate_errors():
        try:
            role = aws.client("iam", region).get_role(RoleName=name)["Role"]
        except ClientError as exc:
            if aws.error_code(exc) != "NoSuchEntity":
                raise
            raise UserError(
                f"IAM role {role_arn_or_name!r} not found in this account: create it or pass another --role"
            ) from exc
    account = role["Arn"].split(":")[4]
    if role_arn_or_name.startswith("arn:") and role_arn_or_name.split(":")[4:5] != [account]:
        raise UserError(f"IAM role {role_arn_or_name!r} is not in this account ({account}): pass one of this account")
    if not _trusts(role.get("AssumeRolePolicyDocument", {}), service_principal):
        raise UserError(
            f"IAM role {name!r} does not trust {service_principal}: add it as a Service principal "
            "allowed to sts:AssumeRole in the role's trust policy"
        )
    return str(role["Arn"])


def upload_if_absent(bucket: str, key: str, data: bytes, region: str | None = None) -> bool:
    """Upload `data` to s3://bucket/key unless an object is already there (for
    content-addressed keys, where same key means same bytes). Returns whether it uploaded."""
    from botocore.exceptions import ClientError

    s3 = aws.client("s3", region)
    with aws.translate_errors():
        try:
            s3.head_object(Bucket=bucket, Key=key)
            return False
        except ClientError as exc:
            # 403 is what S3 answers for a missing key without s3:ListBucket: upload anyway.
            if aws.error_code(exc) not in ("404", "NoSuchKey", "403"):
                raise
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    return True
