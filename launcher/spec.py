"""The job spec: one typed model, loaded from YAML and overridden by CLI flags.

Every backend receives the same JobSpec. Backend-specific settings live only under a
section named after the backend (`sagemaker:`, `local:`). Unknown keys are errors that
name the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from distrain_cloud.infra.errors import UserError
from distrain_cloud.training.args import ArgumentError, hyperparameters_to_argv, known_flags, parse_args
from distrain_cloud.infra.secret_env import REFERENCE
from distrain_cloud.training.strategies import STRATEGIES

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
# Flags the spec owns at the top level; setting them as hyperparameters would fork the truth.
_OWNED_FLAGS = {"strategy": "strategy", "precision": "precision", "push-to-hub": "hub.repo_id",
                "wandb-project": "wandb.project", "wandb-entity": "wandb.entity", "run-name": "wandb.run_name"}


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


class LocalSpec(_Section):
    workdir: Path = Field(Path("runs"), description="each job gets <workdir>/<job name>/ with the contract's folders")
    processes: int | None = Field(None, ge=1, description="processes to start; default one per GPU, else 1")


class SageMakerSpec(_Section):
    role: str | None = Field(None, description="execution role name or ARN; must trust sagemaker.amazonaws.com")
    bucket: str | None = Field(None, description="S3 bucket for code, outputs, checkpoints; default distrain-cloud-<account>-<region>")
    prefix: str = Field("distrain-cloud", description="key prefix inside the bucket")
    image_uri: str | None = Field(None, description="explicit training image; default: the newest HF image the GPU can run")
    transformers_version: str | None = None
    pytorch_version: str | None = None
    volume_size_gb: int = Field(100, ge=1)
    subnets: list[str] = Field(default_factory=list)
    security_group_ids: list[str] = Field(default_factory=list)
    tags: dict[str, str] = Field(default_factory=dict)


class JobSpec(BaseModel):
    """What to run and where. Every field can be set in YAML; common ones also by CLI flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("distrain", description="job name prefix; a timestamp and suffix make each job unique")
    instance: str = Field("local", description="'local', a SageMaker type (ml.p3.8xlarge) or an EC2 type (p4d.24xlarge)")
    nodes: int = Field(1, ge=1, le=64, description="instances; each runs one process per GPU")
    strategy: str = Field("ddp", description="one of " + ", ".join(STRATEGIES))
    precision: Literal["no", "fp16", "bf16"] | None = Field(
        None, description="default: bf16 where the GPU supports it, fp16 on older GPUs, no on CPU")
    region: str | None = Field(None, description="AWS region; default from AWS_REGION / the profile")
    spot: bool = Field(False, description="use spot capacity, resuming from checkpoints after interruptions")
    max_run: int = Field(parse_duration("24h"), description="wall-clock limit (3600, 90m, 6h, 2d)")
    max_wait: int | None = Field(None, description="spot only: limit including waiting for capacity (>= max_run)")
    max_cost: float | None = Field(None, gt=0, description="refuse to submit if the worst-case cost exceeds this (USD)")
    resume_from: str | None = Field(None, description="continue from the checkpoints of this earlier job (same lineage)")
    inputs: dict[str, str] = Field(default_factory=dict, description="data channels: name -> S3 URI or local path")
    hyperparameters: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="training flags, e.g. {task: causal-lm, lr: 3e-4}")
    train_args: list[str] = Field(default_factory=list, description="raw training flags (what follows `--` on the CLI)")
    secrets: dict[str, str] = Field(
        default_factory=dict, description="env var -> Secrets Manager ARN or SSM parameter; resolved inside the job")
    wandb: WandbSpec = Field(default_factory=WandbSpec)
    hub: HubSpec = Field(default_factory=HubSpec)
    sagemaker: SageMakerSpec = Field(default_factory=SageMakerSpec)
    local: LocalSpec = Field(default_factory=LocalSpec)

    @field_validator("max_run", "max_wait", mode="before")
    @classmethod
    def _duration(cls, v):
        return None if v is None else parse_duration(v)

    @field_validator("instance")
    @classmethod
    def _normalise_instance(cls, value: str) -> str:
        # One spelling everywhere after this: the request, the quota check, the backend choice.
        return value.strip().lower()

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        if v not in STRATEGIES:
            raise ValueError(f"unknown strategy {v!r}; choose one of: {', '.join(STRATEGIES)}")
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
                raise ValueError(f"{env} must be a reference (a Secrets Manager ARN, or ssm:/parameter/name), "
                                 "not a value")
        return v

    @model_validator(mode="after")
    def _spot_wait(self) -> "JobSpec":
        if self.max_wait is not None and not self.spot:
            raise ValueError("max_wait applies to spot jobs only; add spot: true or drop max_wait")
        if self.max_wait is not None and self.max_wait < self.max_run:
            raise ValueError(f"max_wait ({self.max_wait}s) must be >= max_run ({self.max_run}s)")
        return self

    # ------------------------------------------------------------------ derived

    @property
    def backend(self) -> str:
        if self.instance == "local":
            return "local"
        return "sagemaker" if self.instance.startswith("ml.") else "ec2"

    def training_argv(self, precision: str, run_name: str) -> list[str]:
        """The training flags every node's entry point receives."""
        argv = hyperparameters_to_argv(self.hyperparameters)
        argv += ["--strategy", self.strategy, "--precision", precision]
        argv += ["--wandb-project", self.wandb.project, "--run-name", self.wandb.run_name or run_name]
        if self.wandb.entity:
            argv += ["--wandb-entity", self.wandb.entity]
        if self.hub.repo_id:
            argv += ["--push-to-hub", self.hub.repo_id]
        return argv + list(self.train_args)

    def check_training_args(self, precision: str, run_name: str) -> list[str]:
        argv = self.training_argv(precision, run_name)
        try:
            parse_args(argv)
        except ArgumentError as e:
            raise UserError(f"training arguments: {e}") from None
        if self.hub.repo_id and "HF_TOKEN" not in self.secrets:
            raise UserError("hub.repo_id needs a token: add --secret HF_TOKEN=<Secrets Manager ARN or ssm:/name>")
        return argv


def _close(word: str, options) -> str:
    import difflib

    match = difflib.get_close_matches(word, sorted(options), n=1)
    return f" (did you mean {match[0].replace('-', '_')!r}?)" if match else ""


def load_spec(path: Path | None, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read a YAML spec (optional) and apply CLI overrides (dotted keys, None = not given)."""
    import yaml

    data: dict[str, Any] = {}
    where = str(path) if path else "the command line"
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise UserError(f"job spec {path} not found") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark else ""
            raise UserError(f"{path} is not valid YAML{at}: {getattr(e, 'problem', e)}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path} must be a mapping of keys (name:, instance:, ...), not {type(data).__name__}")
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
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise UserError(f"{where}: {format_validation_error(e)}") from None


def format_validation_error(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            section = ".".join(str(x) for x in err["loc"][:-1])
            model: type[BaseModel] = JobSpec
            for part in err["loc"][:-1]:
                model = model.model_fields[str(part)].annotation  # type: ignore[assignment]
            known = ", ".join(model.model_fields)
            parts.append(f"unknown key {loc!r}" + (f" in {section}" if section else "") + f"; known keys: {known}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}")
    return "; ".join(parts)
