"""The job spec: one typed model, loaded from YAML and overridden by CLI flags.

Every backend receives the same JobSpec. Backend-specific settings live only under a
section named after the backend (`sagemaker:`, `ec2:`, `local:`). Unknown keys are errors that
name the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.secret_env import REFERENCE
from distrain_cloud.training.args import (
    ArgumentError,
    TrainArgs,
    branch_problem,
    hyperparameters_to_argv,
    known_flags,
    parse_flags,
    repo_id_problem,
)
from distrain_cloud.training.strategies import AUTO, STRATEGY_CHOICES


class TrainingFlags(NamedTuple):
    """A job's training flags, parsed once for its plan (JobSpec.training_args)."""

    argv: list[str]  # what every node's entry point receives
    args: TrainArgs  # argv parsed and checked, as the entry point will: what the plan's parts read
    hyperparameters: dict[str, str]  # the flags that differ from the defaults (a SageMaker request's map)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
# A job name: what SageMaker accepts, and never a path (no dots, no slashes).
JOB_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
CHANNEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
# S3's rules for new buckets: 3-63 of a-z 0-9 . -, starting and ending with a letter or digit,
# no "..", not shaped like an IP address, none of the reserved prefixes and suffixes.
_BUCKET = re.compile(r"(?!xn--|sthree-|amzn-s3-demo-)(?!\d+\.\d+\.\d+\.\d+$)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_KEY_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()/-]{0,200}")
_SUBNET = re.compile(r"subnet-[0-9a-f]{8,17}")
_SECURITY_GROUP = re.compile(r"sg-[0-9a-f]{8,17}")
_AMI = re.compile(r"ami-[0-9a-f]{8}(?:[0-9a-f]{9})?")
_SSM_NAME = re.compile(r"/[A-Za-z0-9_.\-/]{1,2047}")
_ROLE = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}|[\w+=,.@-]{1,64}")
# The CLI flag that sets each key, so a refusal names what the user typed as well as the key.
FLAGS = {
    "name": "--name",
    "instance": "--instance",
    "backend": "--backend",
    "nodes": "--nodes",
    "strategy": "--strategy",
    "precision": "--precision",
    "region": "--region",
    "stack": "--stack",
    "max_run": "--max-run",
    "max_wait": "--max-wait",
    "max_cost": "--max-cost",
    "ec2.max_restarts": "--max-restarts",
    "ec2.on_demand_after": "--on-demand-after",
    "resume_from": "--resume-from",
    "inputs": "--input",
    "secrets": "--secret",
    "sagemaker.role": "--role",
    "sagemaker.image_uri": "--image-uri",
    "sagemaker.keep_alive": "--keep-alive",
    "local.processes": "--processes",
    "hub.repo_id": "--push-to-hub",
    "hub.revision": "--hub-revision",
    "hub.private": "--hub-private",
    "wandb.project": "--wandb-project",
    "wandb.entity": "--wandb-entity",
    "wandb.run_name": "--run-name",
}
# The warm pool bound SageMaker's developer guide (train-warm-pools) and API reference give for
# KeepAlivePeriodInSeconds. botocore 1.44's model allows 21600 (6 h): raise this once AWS documents it.
KEEP_ALIVE_MAX_S = 3600
MAX_SPEC_BYTES = 1 << 20  # a job spec is a page of YAML; anything near this is a mistake
MAX_SPEC_NODES = 100_000  # YAML aliases may not expand a spec past this ("billion laughs")
# Flags the spec owns at the top level; setting them as hyperparameters would fork the truth.
_OWNED_FLAGS = {
    "strategy": "strategy",
    "precision": "precision",
    "push-to-hub": "hub.repo_id",
    "hub-revision": "hub.revision",
    "hub-private": "hub.private",
    "no-hub-private": "hub.private",
    "wandb-project": "wandb.project",
    "wandb-entity": "wandb.entity",
    "run-name": "wandb.run_name",
}


def bucket_problem(name: str) -> str | None:
    """Why `name` cannot be an S3 bucket name, or None."""
    if not _BUCKET.fullmatch(name) or ".." in name or name.endswith(_BUCKET_SUFFIXES):
        return (
            f"{name!r} is not a valid S3 bucket name (3-63 lowercase letters, digits, dots and hyphens, "
            "starting and ending with a letter or digit)"
        )
    return None


def s3_uri_problem(uri: str) -> str | None:
    """Why `uri` is not a usable s3://bucket/key URI, or None."""
    if not uri.startswith("s3://"):
        return f"{uri!r} is not an s3:// URI"
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        return f"{uri!r} names no bucket (write s3://BUCKET/prefix)"
    if len(uri) > 1024:
        return f"the URI is {len(uri)} characters; S3 URIs in a request are at most 1024"
    if any(ord(c) < 32 for c in key):
        return f"{uri!r} holds control characters"
    return bucket_problem(bucket)


def key_prefix(value: str) -> str:
    """`value` if it can be a key prefix inside a bucket, else ValueError saying why."""
    if not _KEY_PREFIX.fullmatch(value) or ".." in value.split("/"):
        raise ValueError(f"{value!r}: a key prefix is at most 200 letters, digits and !_.*'()/- with no '..' part")
    return value


def parse_duration(value: str | int | float) -> int:
    """'6h' / '90m' / '3600' / 3600 -> seconds."""
    if isinstance(value, (int, float)):
        return int(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration; write e.g. 3600, 90m, 6h or 2d")
    return int(float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)])


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WandbSpec(_Section):
    project: str = Field("distrain-cloud", description="W&B project the run is logged to")
    entity: str | None = Field(None, description="W&B team or user; default: the key's default entity")
    run_name: str | None = Field(None, description="display name; default: the job name")


class HubSpec(_Section):
    repo_id: str | None = Field(None, description="push the final model to this Hub repo (needs secrets.HF_TOKEN)")
    revision: str | None = Field(
        None, description="the repo's branch to push to, created from main if missing; default main"
    )
    private: bool = Field(False, description="create the repo private (a repo that exists keeps its visibility)")

    @field_validator("repo_id")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        # Offline, at plan time: a repo id that cannot exist used to fail only at the push, after the run.
        problem = v is not None and repo_id_problem(v)
        if problem:
            raise ValueError(f"{v!r} is not a Hub repo id: {problem}")
        return v

    @field_validator("revision")
    @classmethod
    def _branch(cls, v: str | None) -> str | None:
        problem = v is not None and branch_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _needs_repo(self) -> HubSpec:
        # Without a repo nothing is pushed: a branch or visibility for no push is a mistake.
        for key, value in (("revision", self.revision), ("private", self.private)):
            if value and not self.repo_id:
                raise ValueError(f"{key} (--hub-{key}) needs the repo the model is pushed to: add --push-to-hub REPO")
        return self


class BundleSpec(_Section):
    allow_large: list[str] = Field(
        default_factory=list,
        description="files over the code bundle's per-file limit to ship anyway "
        "(paths from the repository root, e.g. training/assets/vocab.bin)",
    )


class LocalSpec(_Section):
    workdir: Path = Field(Path("runs"), description="each job gets <workdir>/<job name>/ with the contract's folders")
    processes: int | None = Field(None, ge=1, description="processes to start; default one per GPU, else 1")


class SageMakerSpec(_Section):
    role: str | None = Field(None, description="execution role name or ARN; must trust sagemaker.amazonaws.com")
    bucket: str | None = Field(
        None, description="S3 bucket for code, outputs, checkpoints; default distrain-cloud-<account>-<region>"
    )
    prefix: str = Field("distrain-cloud", description="key prefix inside the bucket")
    image_uri: str | None = Field(
        None, description="explicit training image; default: the newest HF image the GPU can run"
    )
    transformers_version: str | None = None
    pytorch_version: str | None = None
    volume_size_gb: int = Field(100, ge=1)
    subnets: list[str] = Field(default_factory=list)
    security_group_ids: list[str] = Field(default_factory=list)
    tags: dict[str, str] = Field(default_factory=dict)
    keep_alive: int | None = Field(
        None,
        description="warm pool: keep the instances this long after the job ends (at most 1h, "
        "ResourceConfig.KeepAlivePeriodInSeconds) so the next job of the same instance settings starts at once; "
        "billed at the instance price meanwhile",
    )

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _keep_alive_duration(cls, v: str | int | float | None) -> int | None:
        return None if v is None else parse_duration(v)

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= KEEP_ALIVE_MAX_S:
            raise ValueError(
                f"{v} s: SageMaker keeps a warm pool at most {KEEP_ALIVE_MAX_S} s (1h); give e.g. 30m, or 0 for none"
            )
        return v or None  # 0: no warm pool

    @field_validator("role")
    @classmethod
    def _role(cls, v: str | None) -> str | None:
        if v is not None and not _ROLE.fullmatch(v):
            raise ValueError(f"{v!r} is neither an IAM role name nor a role ARN (arn:aws:iam::<account>:role/<name>)")
        return v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        problem = v is not None and bucket_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        return key_prefix(v)

    @field_validator("image_uri")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 255 or not v.strip() or any(c.isspace() for c in v)):
            raise ValueError(
                "an image URI is at most 255 characters without spaces (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG)"
            )
        return v

    @field_validator("subnets")
    @classmethod
    def _subnets(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if not _SUBNET.fullmatch(x)]
        if bad or len(v) > 16:
            raise ValueError(f"{bad[0]!r} is not a subnet id (subnet-0123abcd...)" if bad else "at most 16 subnets")
        return v

    @field_validator("security_group_ids")
    @classmethod
    def _security_groups(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if not _SECURITY_GROUP.fullmatch(x)]
        if bad or len(v) > 5:
            raise ValueError(
                f"{bad[0]!r} is not a security group id (sg-0123abcd...)" if bad else "at most 5 security groups"
            )
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        import regex

        allowed = regex.compile(r"[\p{L}\p{Z}\p{N}_.:/=+\-@]*")
        if len(v) > 47:  # SageMaker allows 50; the plan adds 3 of its own
            raise ValueError(f"{len(v)} tags; at most 47 (the job adds 3 of its own)")
        for key, value in v.items():
            if not 1 <= len(key) <= 128 or len(value) > 256:
                raise ValueError(f"tag {key[:40]!r}: keys are 1-128 characters, values at most 256")
            if key.lower().startswith(("aws:", "distrain-cloud:")):
                raise ValueError(f"tag {key!r}: the aws: and distrain-cloud: prefixes are reserved")
            if not allowed.fullmatch(key) or not allowed.fullmatch(value):
                raise ValueError(f"tag {key[:40]!r}: use letters, digits, spaces and _ . : / = + - @ only")
        return v

    @model_validator(mode="after")
    def _vpc(self) -> SageMakerSpec:
        # SageMaker needs both halves of a VPC config; one without the other is a mistake, not a default.
        if bool(self.subnets) != bool(self.security_group_ids):
            given, missing = ("subnets", "security_group_ids") if self.subnets else ("security_group_ids", "subnets")
            raise ValueError(f"{given} without {missing}: a VPC job needs both (or neither)")
        return self


class Ec2Spec(_Section):
    """EC2 jobs: the code, checkpoints and logs live in the stack's bucket and log group."""

    ami_id: str | None = Field(None, description="explicit AMI; default: the newest of ami_family, from SSM")
    ami_parameter: str | None = Field(
        None, description="SSM parameter holding the AMI id; default: the AMI family's public DLAMI parameter"
    )
    ami_family: str | None = Field(
        None, description="oss-pytorch or proprietary-base; default: the one whose NVIDIA driver runs the GPU"
    )
    prefix: str = Field("distrain-cloud", description="key prefix inside the stack's bucket (its Prefix parameter)")
    volume_size_gb: int = Field(200, ge=8, le=16384, description="encrypted gp3 root volume of each node")
    subnet_id: str | None = Field(
        None, description="launch here; default: a default subnet of the stack's VPC, another zone if one is full"
    )
    placement: bool = Field(True, description="multi-node jobs get a cluster placement group of their own")
    efa: bool = Field(
        True, description="multi-node jobs get EFA where supported: one per network card in a private subnet"
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=100,
        description="spot jobs: new attempts after spot interruptions, on AWS's side (an Auto Scaling group); "
        "0: none (an interrupted job stays Interrupted until `resume`)",
    )
    on_demand_after: int | None = Field(
        None,
        ge=1,
        le=100,
        description="spot jobs: after this many interruptions the replacements are on-demand (opt-in)",
    )

    @field_validator("ami_id")
    @classmethod
    def _ami(cls, v: str | None) -> str | None:
        if v is not None and not _AMI.fullmatch(v):
            raise ValueError(f"{v!r} is not an AMI id (ami- and 8 or 17 hex digits)")
        return v

    @field_validator("ami_parameter")
    @classmethod
    def _parameter(cls, v: str | None) -> str | None:
        if v is not None and not _SSM_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not an SSM parameter name (/path/to/name: letters, digits and _.-/)")
        return v

    @field_validator("subnet_id")
    @classmethod
    def _subnet(cls, v: str | None) -> str | None:
        if v is not None and not _SUBNET.fullmatch(v):
            raise ValueError(f"{v!r} is not a subnet id (subnet-0123abcd...)")
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        return key_prefix(v)

    @model_validator(mode="after")
    def _one_ami(self) -> Ec2Spec:
        if self.ami_id and self.ami_parameter:
            raise ValueError("ami_id and ami_parameter both name the AMI: keep one")
        return self


def inferred_backend(instance: str) -> str:
    """The backend an instance name implies when the spec names none: 'local', ml.* SageMaker, else EC2."""
    if instance == "local":
        return "local"
    return "sagemaker" if instance.startswith("ml.") else "ec2"


# backend -> (whether it runs an instance of that name, what that is, where it runs): a new backend adds a row.
INSTANCE_KINDS: dict[str, tuple[Any, str, str]] = {
    "local": (lambda i: i == "local", "'local'", "on this machine"),
    "sagemaker": (lambda i: i.startswith("ml."), "a SageMaker type", "on SageMaker"),
    "ec2": (lambda i: i != "local" and not i.startswith("ml."), "an EC2 type", "on EC2"),
}
# How --instance picks each backend, for a refusal to give as its fix (here, and backends.get_backend).
INSTANCE_EXAMPLES = {
    "local": "--instance local",
    "sagemaker": "--instance ml.g5.12xlarge",
    "ec2": "--instance g5.12xlarge",
}


class JobSpec(BaseModel):
    """What to run and where. Every field can be set in YAML; common ones also by CLI flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("distrain", description="job name prefix; a timestamp and suffix make each job unique")
    instance: str = Field(
        "local", description="'local', a SageMaker type (ml.p3.8xlarge) or an EC2 type (p4d.24xlarge)"
    )
    backend: Literal["local", "sagemaker", "ec2"] = Field(
        "local",
        description="where the job runs: local, sagemaker or ec2; default from the instance "
        "('local', ml.* for SageMaker, any other type for EC2)",
    )
    nodes: int = Field(1, ge=1, le=64, description="instances; each runs one process per GPU")
    strategy: str = Field(AUTO, description="one of " + ", ".join(STRATEGY_CHOICES))
    precision: Literal["no", "fp16", "bf16", "fp8"] | None = Field(
        None,
        description="default: bf16 where the GPU supports it, fp16 on older GPUs, no on CPU; fp8: float8 matmuls "
        "(compute capability >= 8.9, --strategy ddp or single; auto picks ddp; torch alone, torchao's layers with "
        "the training flag --fp8-linear torchao)",
    )
    region: str | None = Field(None, description="AWS region; default from AWS_REGION / the profile")
    stack: str = Field(
        "distrain-cloud",
        description="the `distrain-cloud infra up` stack whose role and bucket cloud jobs use when the spec names none",
    )
    spot: bool = Field(False, description="use spot capacity, resuming from checkpoints after interruptions")
    max_run: int = Field(
        parse_duration("24h"),
        description="wall-clock limit (3600, 90m, 6h, 2d); a local job has one only where given, and stops at it "
        "with a checkpoint, as `cancel` stops it",
    )
    max_wait: int | None = Field(None, description="spot only: limit including waiting for capacity (>= max_run)")
    max_cost: float | None = Field(
        None,
        gt=0,
        description="USD: EC2 nodes stop the job with a checkpoint before its cost passes this; "
        "SageMaker refuses a job whose worst case exceeds it",
    )
    resume_from: str | None = Field(
        None, description="continue from the checkpoints of this earlier job (same lineage)"
    )
    inputs: dict[str, str] = Field(default_factory=dict, description="data channels: name -> S3 URI or local path")
    hyperparameters: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="training flags, e.g. {task: causal-lm, lr: 3e-4}"
    )
    train_args: list[str] = Field(default_factory=list, description="raw training flags (what follows `--` on the CLI)")
    secrets: dict[str, str] = Field(
        default_factory=dict, description="env var -> Secrets Manager ARN or SSM parameter; resolved inside the job"
    )
    wandb: WandbSpec = Field(default_factory=WandbSpec)
    hub: HubSpec = Field(default_factory=HubSpec)
    bundle: BundleSpec = Field(default_factory=BundleSpec)
    sagemaker: SageMakerSpec = Field(default_factory=SageMakerSpec)
    local: LocalSpec = Field(default_factory=LocalSpec)
    ec2: Ec2Spec = Field(default_factory=Ec2Spec)

    @field_validator("max_run", "max_wait", mode="before")
    @classmethod
    def _duration(cls, v: str | int | float | None) -> int | None:
        return None if v is None else parse_duration(v)

    @field_validator("instance")
    @classmethod
    def _normalise_instance(cls, value: str) -> str:
        # One spelling everywhere after this: the request, the quota check, the backend choice.
        return value.strip().lower()

    @field_validator("max_run", "max_wait")
    @classmethod
    def _positive(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"{v}s is not a limit: give at least 1 second (e.g. 90m, 6h, 2d)")
        return v

    @field_validator("resume_from")
    @classmethod
    def _job_name(cls, v: str | None) -> str | None:
        # A job name is also a folder and an S3 prefix: it must never climb out of them.
        if v is not None and not JOB_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a job name (letters, digits and hyphens, as `distrain-cloud ls` shows)")
        return v

    @field_validator("inputs")
    @classmethod
    def _channels(cls, v: dict[str, str]) -> dict[str, str]:
        for channel, source in v.items():
            if not CHANNEL_NAME.fullmatch(channel):
                raise ValueError(f"channel name {channel!r}: use 1-64 letters, digits, dots, hyphens or underscores")
            if source.startswith("s3:") or "://" in source:
                problem = s3_uri_problem(source)
                if problem:
                    raise ValueError(f"{channel}: {problem}")
            elif not source.strip():
                raise ValueError(f"{channel}: give an s3:// URI or a local path")
        return v

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        if v not in STRATEGY_CHOICES:
            raise ValueError(f"unknown strategy {v!r}; choose one of: {', '.join(STRATEGY_CHOICES)}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,31}", v):
            raise ValueError(f"{v!r} must be 1-32 letters, digits and hyphens, starting with a letter or digit")
        return v

    @field_validator("hyperparameters")
    @classmethod
    def _known_hyperparameters(cls, v: dict) -> dict:
        known = known_flags()
        for key in v:
            flag = key.replace("_", "-")
            if flag in _OWNED_FLAGS:
                raise ValueError(f"set {_OWNED_FLAGS[flag]} at the top of the spec, not hyperparameters.{key}")
            if flag not in known:
                close = _close(flag, known)
                raise ValueError(f"unknown training flag {key!r}{close}; see `distrain-train --help`")
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_refs(cls, v: dict) -> dict:
        for env, ref in v.items():
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", env):
                raise ValueError(f"{env!r} is not an environment variable name (use e.g. HF_TOKEN)")
            if not REFERENCE.match(ref):
                # Never echo the value: it may be the secret itself pasted by mistake.
                raise ValueError(
                    f"{env} must be a reference (a Secrets Manager ARN, or ssm:/parameter/name), not a value"
                )
        return v

    @model_validator(mode="before")
    @classmethod
    def _default_backend(cls, data: Any) -> Any:
        # Unset, the backend follows the instance, as it always did: every existing spec keeps working.
        if isinstance(data, dict) and data.get("backend") is None:
            instance = data.get("instance", cls.model_fields["instance"].default)
            if isinstance(instance, str):
                data = {**data, "backend": inferred_backend(instance.strip().lower())}
        return data

    @model_validator(mode="after")
    def _backend_runs_instance(self) -> JobSpec:
        if not INSTANCE_KINDS[self.backend][0](self.instance):
            inferred = inferred_backend(self.instance)
            fix = INSTANCE_EXAMPLES[self.backend]
            if {self.backend, inferred} == {"ec2", "sagemaker"}:  # the same type, spelled for the other
                other = self.instance.removeprefix("ml.") if self.backend == "ec2" else f"ml.{self.instance}"
                fix = f"--instance {other}"
            raise ValueError(
                f"--backend {self.backend} cannot run --instance {self.instance} ({INSTANCE_KINDS[inferred][1]}): "
                f"give {fix}, or drop --backend to run it {INSTANCE_KINDS[inferred][2]}"
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A backend the instance implies is left out of dumps (job records, job.json, resumed specs),
        # so they read as before this field existed; an explicit other one is kept.
        data: dict[str, Any] = handler(self)
        if data.get("backend") == inferred_backend(self.instance):
            data.pop("backend")
        return data

    @model_validator(mode="after")
    def _keep_alive_on_sagemaker(self) -> JobSpec:
        if self.sagemaker.keep_alive and not self.instance.startswith("ml."):
            raise ValueError(
                f"--keep-alive keeps a SageMaker warm pool; {self.instance} is not a SageMaker (ml.*) instance: "
                "drop --keep-alive"
            )
        if self.sagemaker.keep_alive and self.spot:
            # SageMaker Developer Guide, "Train Using SageMaker Managed Warm Pools", considerations:
            # warm pools cannot be used with managed spot training.
            raise ValueError(
                "--keep-alive keeps a SageMaker warm pool, which AWS does not offer for spot jobs: drop --keep-alive "
                "or --spot (a warm pool also needs its Service Quotas quota raised: it starts at 0 per instance type)"
            )
        return self

    @model_validator(mode="after")
    def _spot_wait(self) -> JobSpec:
        if self.max_wait is not None and not self.spot:
            raise ValueError("max_wait applies to spot jobs only; add spot: true or drop max_wait")
        if self.max_wait is not None and self.max_wait < self.max_run:
            raise ValueError(f"max_wait ({self.max_wait}s) must be >= max_run ({self.max_run}s)")
        default_restarts = type(self.ec2).model_fields["max_restarts"].default
        after = self.ec2.on_demand_after
        if self.backend != "ec2" and (self.ec2.max_restarts != default_restarts or after is not None):
            # Only EC2 jobs restart on AWS's side (an Auto Scaling group); a SageMaker spot job waits
            # for capacity within --max-wait and resumes from its checkpoints by itself.
            flag = "--max-restarts" if self.ec2.max_restarts != default_restarts else "--on-demand-after"
            how = {"sagemaker": "SageMaker resumes an interrupted spot job itself, within --max-wait"}.get(
                self.backend, "a local job is never interrupted"
            )
            raise ValueError(f"{flag} applies to EC2 spot jobs, not {self.backend} ones ({how}): drop it")
        if self.ec2.max_restarts != default_restarts and not self.spot:  # else silently ignored
            raise ValueError("ec2.max_restarts (--max-restarts) applies to spot jobs only; add --spot or drop it")
        if after is not None and not self.spot:
            raise ValueError("ec2.on_demand_after (--on-demand-after) applies to spot jobs only; add --spot or drop it")
        if after is not None and after > self.ec2.max_restarts:
            raise ValueError(
                f"ec2.on_demand_after (--on-demand-after) {after} is never reached with --max-restarts "
                f"{self.ec2.max_restarts}: raise --max-restarts or lower --on-demand-after"
            )
        return self

    # ------------------------------------------------------------------ derived

    def training_argv(self, precision: str, run_name: str) -> list[str]:
        """The training flags every node's entry point receives."""
        argv = hyperparameters_to_argv(self.hyperparameters)
        argv += ["--strategy", self.strategy, "--precision", precision]
        argv += ["--wandb-project", self.wandb.project, "--run-name", self.wandb.run_name or run_name]
        if self.wandb.entity:
            argv += ["--wandb-entity", self.wandb.entity]
        if self.hub.repo_id:
            argv += ["--push-to-hub", self.hub.repo_id]
        if self.hub.revision:
            argv += ["--hub-revision", self.hub.revision]
        if self.hub.private:
            argv += ["--hub-private"]
        return argv + list(self.train_args)

    def check_training_args(self, precision: str, run_name: str) -> list[str]:
        return self.training_args(precision, run_name).argv

    def training_args(self, precision: str, run_name: str) -> TrainingFlags:
        """training_argv, checked as the job's entry point will parse it, and the parsed arguments
        (a plan parses them here once, and its every part reads these: Plan.training)."""
        argv = self.training_argv(precision, run_name)
        try:
            args, hyperparameters = parse_flags(argv)
        except ArgumentError as e:
            raise UserError(f"training arguments: {e}{_flag_hint(str(e))}") from None
        # Known before training, not after it: a push without a token would lose the run.
        local_token = self.backend == "local" and os.environ.get("HF_TOKEN")
        if self.hub.repo_id and "HF_TOKEN" not in self.secrets and not local_token:
            raise UserError(
                f"--push-to-hub {self.hub.repo_id} needs a Hub token: add --secret HF_TOKEN=<Secrets Manager ARN or "
                "ssm:/name>" + (" or set HF_TOKEN in this environment" if self.backend == "local" else "")
            )
        return TrainingFlags(argv, args, hyperparameters)


def _flag_hint(error: str) -> str:
    """A did-you-mean for the first flag argparse did not recognise in `error`, or nothing."""
    import difflib

    from distrain_cloud.training.args import build_parser

    if not error.startswith("unrecognized arguments: "):
        return ""
    options = {s for action in build_parser()._actions for s in action.option_strings if s.startswith("--")}
    for word in error.removeprefix("unrecognized arguments: ").split():
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in options:
            match = difflib.get_close_matches(flag, sorted(options), n=1, cutoff=0.7)  # not --n-layer: --run-name
            return f" (did you mean {match[0]}?)" if match else ""
    return ""


def _close(word: str, options: Iterable[str]) -> str:
    import difflib

    match = difflib.get_close_matches(word, sorted(options), n=1)
    return f" (did you mean {match[0].replace('-', '_')!r}?)" if match else ""


def load_spec(
    path: Path | None, overrides: dict[str, Any] | None = None, base: dict[str, Any] | None = None
) -> JobSpec:
    """Read a YAML spec (optional) and apply CLI overrides (dotted keys, None = not given).

    `base` (a resumed job's spec) lies under both: the file's keys replace its keys (sections key
    by key), and its training flags come first, so flags given again win."""
    data: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in (base or {}).items()}
    where = str(path) if path else "the command line"
    if path is not None:
        for key, value in read_spec_file(Path(path)).items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            elif key == "train_args" and isinstance(value, list):
                data[key] = list(data.get(key) or []) + value
            else:
                data[key] = value
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        if isinstance(value, dict):
            node[leaf] = {**(node.get(leaf) or {}), **value}
        elif isinstance(value, list) and leaf == "train_args":
            node[leaf] = list(node.get(leaf) or []) + value
        else:
            node[leaf] = value
    _refuse_owned_training_flags(data.get("train_args") or [])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise UserError(f"{where}: {format_validation_error(e)}") from None


# Per-user defaults, under every spec: ~/.config/distrain-cloud/config.yaml, then DISTRAIN_* variables.
USER_DEFAULTS = {
    "region": "region",
    "stack": "stack",
    "bucket": "sagemaker.bucket",
    "role": "sagemaker.role",
    "wandb_project": "wandb.project",
    "wandb_entity": "wandb.entity",
}


def user_config_path() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "distrain-cloud" / "config.yaml"


def user_defaults() -> dict[str, Any]:
    """The spec keys this user set once for every job: the config file's, then DISTRAIN_<KEY>
    variables over them. A job's spec file and flags override both."""
    path = user_config_path()
    values = read_spec_file(path) if path.is_file() else {}
    unknown = sorted(set(values) - set(USER_DEFAULTS))
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r}; known keys: {', '.join(USER_DEFAULTS)}")
    for key in USER_DEFAULTS:
        env = os.environ.get(f"DISTRAIN_{key.upper()}")
        if env:
            values[key] = env
    data: dict[str, Any] = {}
    for key, value in values.items():
        section, _, leaf = USER_DEFAULTS[key].rpartition(".")
        (data.setdefault(section, {}) if section else data)[leaf] = str(value)
    return data


def _refuse_owned_training_flags(train_args: list[Any]) -> None:
    """A setting has one source: the spec's. Given again after `--` it would train with one value
    while the plan shows the other."""
    for arg in train_args:
        flag = str(arg).split("=", 1)[0]
        if flag.startswith("--") and flag[2:] in _OWNED_FLAGS:
            key = _OWNED_FLAGS[flag[2:]]
            raise UserError(
                f"give {flag} before `--`, not after it (in a spec file: {key}): the launcher sets it, "
                "so the plan shows what every node trains with"
            )


def read_spec_file(path: Path) -> dict[str, Any]:
    """The mapping in a job spec file, refused in one line when it is not one."""
    import yaml

    if not path.exists():
        raise UserError(f"job spec {path} not found")
    if not path.is_file():
        raise UserError(f"job spec {path} is not a file (give the YAML file, e.g. examples/local-quickstart.yaml)")
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise UserError(f"job spec {path} is {path.stat().st_size} bytes; a spec is at most {MAX_SPEC_BYTES}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"job spec {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_expansion(node, path)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    finally:
        loader.dispose()
    if data is None:
        # An empty spec would silently mean "all defaults": almost always the wrong file.
        raise UserError(
            f"job spec {path} is empty (or only comments); write at least `instance: local`, "
            "or leave the file out to use flags alone"
        )
    if not isinstance(data, dict):
        raise UserError(f"{path} must be a mapping of keys (name:, instance:, ...), not {type(data).__name__}")
    return data


def _check_expansion(root: Any, path: Path) -> None:
    """Refuse YAML whose aliases expand it past MAX_SPEC_NODES, or refer to themselves."""
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise UserError(f"{path}: a YAML alias refers to itself; a job spec holds plain values")
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        active.discard(key)
        if total > MAX_SPEC_NODES:
            raise UserError(f"{path}: YAML aliases expand it past {MAX_SPEC_NODES} values; write the spec out plainly")
        sizes[key] = total
        return total

    size(root)


def format_validation_error(e: ValidationError) -> str:
    parts = []
    unknown: dict[tuple[str, ...], list[str]] = {}  # a section's unknown keys, named together
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            unknown.setdefault(tuple(str(x) for x in err["loc"][:-1]), []).append(str(err["loc"][-1]))
        else:
            msg = err["msg"].removeprefix("Value error, ")
            key = ".".join(str(x) for x in err["loc"][:2])
            flag = FLAGS.get(key) or FLAGS.get(str(err["loc"][:1] and err["loc"][0]))
            label = f"{loc} ({flag})" if flag else loc
            parts.append(f"{label}: {msg}" if label else msg)
    parts += [_unknown_keys(section, keys) for section, keys in unknown.items()]
    return "; ".join(parts)


def _unknown_keys(section: tuple[str, ...], keys: list[str]) -> str:
    """One message for a section's unknown keys: each named with the key it is probably a typo of,
    training flags written at the top pointed to hyperparameters, then the section's known keys."""
    model: type[BaseModel] = JobSpec
    for part in section:
        model = model.model_fields[part].annotation  # type: ignore[assignment]
    known = list(model.model_fields)
    # a training flag at the top of the spec is the usual slip (`batch_size: 32` for
    # `hyperparameters: {batch_size: 32}`); flags the spec owns are known keys already
    flags = [k for k in keys if not section and k.replace("_", "-") in known_flags()]
    named = [f"{'.'.join([*section, k])!r}" + ("" if k in flags else _close(k, known)) for k in keys]
    where = f" in {'.'.join(section)}" if section else ""
    text = f"unknown key{'s' if len(keys) > 1 else ''} {', '.join(named)}{where}"
    if flags:
        example = ", ".join(f"{k}: ..." for k in flags[:2])
        text += f"; {', '.join(flags)} {'are training flags' if len(flags) > 1 else 'is a training flag'}: "
        text += f"put {'them' if len(flags) > 1 else 'it'} under hyperparameters (hyperparameters: {{{example}}})"
    return f"{text}; known keys: {', '.join(known)}"
