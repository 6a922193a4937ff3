"""The SageMaker request: what a plan is made of besides the spec (Parts) and the one
CreateTrainingJob request built from them, all pure: no AWS call here (launcher/apimodel.py checks
the request against the API model, `refuse_api_problems`)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra import job_role
from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.resources import default_bucket
from distrain_cloud.training.contract import SAGEMAKER_CHECKPOINT_DIR

from ...tracking import tracking_env
from .. import cloud
from .entrypoint import sagemaker_entrypoint

if TYPE_CHECKING:
    from ...spec import JobSpec

CODE_CHANNEL = "code"
TAG_PREFIX = "distrain-cloud:"
METRIC_REGEX = "{}=([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|nan|inf))"
METRICS = ("train_loss", "eval_loss", "eval_accuracy", "eval_f1_macro", "eval_perplexity", "tokens_per_sec")


@dataclasses.dataclass(frozen=True)
class Parts:
    """What the request is made of besides the spec, fixed at plan time (the job name above all)."""

    job_name: str
    region: str
    image_uri: str
    # The training flags that differ from the defaults, as the request carries them (parsed once,
    # with the plan's: JobSpec.training_args); the job turns them back into flags (hyperparameters_to_argv).
    hyperparameters: tuple[tuple[str, str], ...]
    prefix: str
    code_sha256: str
    lineage: str
    max_wait: int | None


def checkpoint_uri_of(bucket: str, parts: Parts) -> str:
    # A lineage shares one checkpoint prefix: resumed attempts read what earlier ones wrote.
    return f"s3://{bucket}/{parts.prefix}/checkpoints/{parts.lineage}/"


def build(
    spec: JobSpec,
    parts: Parts,
    account: str,
    role_arn: str,
    bucket: str | None = None,
    checkpoint_uri: str | None = None,
) -> dict[str, Any]:
    """The CreateTrainingJob request, all of it; `bucket` and `checkpoint_uri` default to the
    account's (placeholders until preflight names them)."""
    from ...bundle import bundle_key

    bucket = bucket or spec.sagemaker.bucket or default_bucket(account, parts.region)
    checkpoint_uri = checkpoint_uri or checkpoint_uri_of(bucket, parts)
    code_uri = f"s3://{bucket}/{bundle_key(parts.prefix, parts.code_sha256)}"
    channels = [
        {
            "ChannelName": CODE_CHANNEL,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": code_uri,
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": "File",
        }
    ]
    for name, uri in sorted(spec.inputs.items()):
        if not uri.startswith("s3://"):
            raise UserError(f"--input {name}={uri}: SageMaker channels must be s3:// URIs")
        if name == CODE_CHANNEL:
            raise UserError(f"--input {name}: the channel name '{CODE_CHANNEL}' is reserved for the code bundle")
        channels.append(
            {
                "ChannelName": name,
                "InputMode": "File",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": uri,
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
            }
        )
    environment = {
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **tracking_env(lineage=parts.lineage, instance=spec.instance, image=parts.image_uri),
    }
    if spec.secrets:
        environment["DISTRAIN_SECRETS"] = json.dumps(spec.secrets, sort_keys=True)  # references only
    stopping = {"MaxRuntimeInSeconds": spec.max_run}
    if spec.spot and parts.max_wait is not None:  # a spot job's plan always sets it
        stopping["MaxWaitTimeInSeconds"] = parts.max_wait
    tags = [
        {"Key": f"{TAG_PREFIX}code-sha256", "Value": parts.code_sha256},
        {"Key": f"{TAG_PREFIX}lineage", "Value": parts.lineage},
        {"Key": f"{TAG_PREFIX}strategy", "Value": spec.strategy},
    ]
    tags += [{"Key": k, "Value": v} for k, v in sorted(spec.sagemaker.tags.items())]
    request: dict[str, Any] = {
        "TrainingJobName": parts.job_name,
        "RoleArn": role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": parts.image_uri,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": sagemaker_entrypoint(CODE_CHANNEL),
            "MetricDefinitions": [{"Name": m, "Regex": METRIC_REGEX.format(m)} for m in METRICS],
        },
        "HyperParameters": dict(parts.hyperparameters),
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/{parts.prefix}/jobs/"},
        "ResourceConfig": {
            "InstanceType": spec.instance,
            "InstanceCount": spec.nodes,
            "VolumeSizeInGB": spec.sagemaker.volume_size_gb,
            **({"KeepAlivePeriodInSeconds": spec.sagemaker.keep_alive} if spec.sagemaker.keep_alive else {}),
        },
        "StoppingCondition": stopping,
        "EnableManagedSpotTraining": spec.spot,
        "CheckpointConfig": {"S3Uri": checkpoint_uri, "LocalPath": SAGEMAKER_CHECKPOINT_DIR},
        "Environment": environment,
        "Tags": tags,
    }
    if spec.sagemaker.subnets:
        request["VpcConfig"] = {
            "Subnets": spec.sagemaker.subnets,
            "SecurityGroupIds": spec.sagemaker.security_group_ids,
        }
    return request


def offline_identity(spec: JobSpec, job_name: str, unknown_account: str) -> tuple[str, str]:
    """(account, role ARN) as far as they are known without asking AWS; with no role, the job's own
    (made at submit under the stack's path)."""
    role = spec.sagemaker.role or f"{job_role.role_path(spec.stack).lstrip('/')}{job_name}"
    account = role.split(":")[4] if role.startswith("arn:") else unknown_account
    return account, role if role.startswith("arn:") else f"arn:aws:iam::{account}:role/{role}"


# Which flag or spec key sets each part of the request, so a refusal names what the user wrote.
REQUEST_SOURCES = (
    ("TrainingJobName", "--name"),
    ("RoleArn", "--role"),
    ("AlgorithmSpecification.TrainingImage", "--image-uri"),
    ("HyperParameters", "training flags (hyperparameters: or after --)"),
    ("InputDataConfig", "--input"),
    ("OutputDataConfig", "sagemaker.bucket / sagemaker.prefix"),
    ("CheckpointConfig", "sagemaker.bucket / sagemaker.prefix / --resume-from"),
    ("ResourceConfig.InstanceType", "--instance"),
    ("ResourceConfig.InstanceCount", "--nodes"),
    ("ResourceConfig.VolumeSizeInGB", "sagemaker.volume_size_gb"),
    ("ResourceConfig.KeepAlivePeriodInSeconds", "--keep-alive"),
    ("StoppingCondition.MaxRuntimeInSeconds", "--max-run"),
    ("StoppingCondition.MaxWaitTimeInSeconds", "--max-wait"),
    ("VpcConfig", "sagemaker.subnets / sagemaker.security_group_ids"),
    ("Environment", "--secret / the job's lineage, instance and image"),
    ("Tags", "sagemaker.tags"),
)


def refuse_api_problems(request: dict[str, Any]) -> None:
    """Raise one UserError naming the flag or key behind each part of `request` that breaks
    SageMaker's API model."""
    cloud.refuse_api_problems("sagemaker", "CreateTrainingJob", request, REQUEST_SOURCES, "SageMaker")
