"""`distrain-cloud export`: the job `submit` would run, as another engine's manifest.

SkyPilot (a task YAML for `sky launch` / `sky jobs launch`), Kubeflow Trainer v2 (a TrainJob) and
Kubeflow training-operator (a PyTorchJob). Each manifest runs the entry point every backend runs
on every node, `python -m distrain_cloud.training.node_launch -- TRAINING FLAGS`, with the training
flags, precision and strategy that `submit` resolves for the accelerator asked for
(backends/cloud.plan_training); the engine's own variables give each node the cluster's shape
(training/contract.py reads them and refuses incomplete ones). Secrets are references the engine
resolves (SkyPilot `secrets:`, Kubernetes `secretKeyRef`), never values. What an engine cannot
express is refused in one line. Pure: nothing is sent anywhere.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from .catalog import InstanceType
    from .spec import JobSpec

ENGINES = ("skypilot", "trainjob", "pytorchjob")
ENTRY_POINT = ["python", "-m", "distrain_cloud.training.node_launch"]
# Where a Kubernetes pod mounts the ReadWriteMany volume named by --checkpoints pvc:CLAIM.
SHARED = "/shared"
# Where a SkyPilot node mounts the bucket named by --checkpoints (cached: written like a disk); the
# job's checkpoints, model and outputs go under JOB/ there, so a spot job's results outlive its cluster.
SKY_BUCKET = "/distrain-job"
# Where a SkyPilot node gets the code of an installed launcher (no checkout to sync as its workdir).
SKY_CODE = "~/distrain-cloud"
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# A name each engine takes: Kubernetes' DNS-1035 label (TrainJob's rule, the PyTorchJob webhook's),
# which SkyPilot's cluster names accept too: a lowercase letter first.
_JOB_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a Secret's or claim's name (DNS-1123)
_BUCKET_URI = re.compile(r"(s3|gs|r2|cos|oci)://[a-z0-9][a-z0-9._-]{1,62}(/[^\s]*)?")
_CLAIM = re.compile(r"pvc:([a-z0-9]([-a-z0-9.]*[a-z0-9])?)")
# The PyTorchJob operator finds its rendezvous port on this container and port name.
PYTORCHJOB_CONTAINER, PYTORCHJOB_PORT = "pytorch", ("pytorchjob-port", 23456)


@dataclass(frozen=True)
class ExportOptions:
    """What `export` takes besides the job spec (flags with no place in a JobSpec)."""

    engine: str
    accelerator: str | None = None  # "A100:8", "L4:4", "cpu"; default: the spec's instance type's GPUs
    processes: int | None = None  # per node, on CPUs (GPUs: one per GPU)
    image: str | None = None  # a container image with distrain-cloud[train] installed
    checkpoints: str | None = None  # s3://bucket/prefix (SkyPilot) or pvc:CLAIM (Kubernetes)
    secrets: dict[str, str] = field(default_factory=dict)  # ENV -> "" (SkyPilot) or "secret/key" (Kubernetes)
    runtime: str = "torch-distributed"  # the TrainJob's ClusterTrainingRuntime


@dataclass(frozen=True)
class Export:
    engine: str
    job_name: str
    manifest: dict[str, Any]
    command: list[str]  # what every node runs
    precision: str
    strategy: str  # as a plan shows it: auto's pick and why
    next_step: str  # the engine's command that starts it
    notes: list[str] = field(default_factory=list)  # what the user should know (stderr)

    def text(self) -> str:
        import yaml

        header = (
            f"# distrain-cloud export {self.engine}: {self.job_name}\n"
            f"# precision {self.precision}, strategy {self.strategy}\n# start it: {self.next_step}\n"
        )

        class Dumper(yaml.SafeDumper):
            pass

        def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:  # scripts read as written
            style = "|" if "\n" in value else None
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

        Dumper.add_representer(str, text)
        Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]  # kubectl users read it
        return header + yaml.dump(self.manifest, Dumper=Dumper, sort_keys=False, width=1000)


def export_job(spec: JobSpec, options: ExportOptions) -> Export:
    """The manifest of `spec` for `options.engine`; UserError for what the engine cannot express.
    A limit is exported where the spec sets it (a default max_run is no request)."""
    from .backends.cloud import plan_training

    engine = options.engine
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    _refuse_inexpressible(spec, options)
    instance = _instance(spec, options)
    secrets = _secrets(options)
    if spec.hub.repo_id and "HF_TOKEN" not in secrets:
        raise UserError(
            f"--push-to-hub {spec.hub.repo_id} needs a Hub token: add --secret HF_TOKEN{_secret_form(engine)}"
        )
    # plan_training refuses a push without a token among the spec's (AWS) references; the export's
    # token is the engine's reference above, and no reference of the spec's reaches the manifest.
    planned = spec.model_copy(update={"secrets": {"HF_TOKEN": "ssm:/unused"}}) if spec.hub.repo_id else spec
    training = plan_training(planned, instance, main_addr="MAIN_NODE")
    job_name = training.job_name.lower()
    if engine != "skypilot":
        job_name = job_name[:40].rstrip("-")  # the pods' and services' names add to it (63 at most)
    if not _JOB_NAME.fullmatch(job_name):
        raise UserError(
            f"--name {spec.name}: {engine} needs a name of lowercase letters, digits and hyphens that starts "
            f"with a letter (e.g. --name job-{re.sub('[^a-z0-9-]+', '-', spec.name.lower()).strip('-') or 'run'})"
        )
    argv, precision = list(training.argv), training.precision
    if engine != "skypilot" and spec.precision is None and instance.gpus:
        # A Kubernetes pod asks for `nvidia.com/gpu`, any model the cluster has: the node picks the
        # precision for the GPU it gets (bf16 from compute capability 8.0, else fp16), as training
        # does wherever --precision is not given.
        at = argv.index("--precision")
        del argv[at : at + 2]
        precision = f"the node's pick for its GPUs ({training.precision} on {instance.gpu_model})"
    command = list(ENTRY_POINT)
    if options.processes:
        command += ["--processes", str(options.processes)]
    command += ["--", *argv]
    per_node = options.processes or training.processes
    env = _job_env(spec, options, job_name, instance)
    if engine == "skypilot":
        manifest, next_step, notes = _skypilot(spec, options, job_name, instance, command, env, secrets)
    else:
        manifest, next_step, notes = _kubernetes(spec, options, job_name, instance, command, env, secrets, per_node)
    if training.fit.ok is False:
        notes.append(f"memory: {training.fit.detail}")
    if training.image:  # what the image must carry that the job does not install (torchao)
        notes.append(f"{training.image.name}: {training.image.detail}")
    return Export(engine, job_name, manifest, command, precision, training.strategy, next_step, notes)


def _refuse_inexpressible(spec: JobSpec, options: ExportOptions) -> None:
    from .backends import BACKENDS

    engine = options.engine
    kube = engine != "skypilot"

    def refuse(flag: str, why: str) -> None:
        raise UserError(f"{flag}: {why} ({engine} cannot express it); drop it")

    if spec.max_wait is not None:
        refuse("--max-wait", "a limit on waiting for spot capacity")
    if spec.max_cost is not None:
        refuse("--max-cost", "a budget the launcher checks before it submits, with prices of its own catalog")
    if spec.resume_from:
        refuse(
            "--resume-from", "another job's checkpoints are where its backend kept them; point --checkpoints at them"
        )
    if spec.secrets:
        names = ", ".join(spec.secrets)
        raise UserError(
            f"secrets: {names} name AWS references, which {engine} does not resolve; give --secret "
            f"NAME{_secret_form(engine)} instead (the engine's own secret)"
        )
    if not kube and "max_run" in spec.model_fields_set:
        refuse("--max-run", "a wall-clock limit on the job")
    if kube and spec.spot:
        refuse("--spot", "spot capacity is the cluster's node pools' business, not the job's")
    if kube and spec.region:
        refuse("--region", "the cluster is where the job runs")
    if kube and spec.inputs:
        refuse("--input", "a data channel needs a volume of the cluster's; put the data on the --checkpoints volume")
    for channel, source in spec.inputs.items():
        if not _BUCKET_URI.fullmatch(source):
            refuse(f"--input {channel}={source}", "a path on this machine, which the engine's nodes cannot read")
    for section in BACKENDS:  # a backend's settings section is named after it (spec.py)
        settings = getattr(spec, section, None)
        if settings is not None and settings.model_fields_set - {"workdir"}:
            refuse(f"{section}:", f"settings of the {section} backend")
    if kube and not options.image:
        raise UserError(
            f"{engine} needs --image IMAGE: a container image with distrain-cloud[train] installed "
            "(its pods cannot fetch the code bundle)"
        )
    if options.checkpoints:
        ok = _CLAIM.fullmatch(options.checkpoints) if kube else _BUCKET_URI.fullmatch(options.checkpoints)
        if not ok:
            want = "pvc:CLAIM (a ReadWriteMany volume claim)" if kube else "a bucket URI, e.g. s3://BUCKET/prefix"
            raise UserError(f"--checkpoints {options.checkpoints}: {engine} takes {want}")
    if options.processes is not None and options.processes < 1:
        raise UserError(f"--processes {options.processes}: give at least 1")
    if not kube and spec.spot and not options.checkpoints:
        raise UserError(
            "--spot: a SkyPilot managed spot job restarts on a new cluster, which starts from step 0 and loses "
            "the model with the old one: add --checkpoints s3://BUCKET/prefix (every node mounts it)"
        )


def _secret_form(engine: str) -> str:
    return "" if engine == "skypilot" else "=SECRET/KEY"


def _secrets(options: ExportOptions) -> dict[str, tuple[str, str] | None]:
    """ENV -> (Kubernetes Secret, key), or None for SkyPilot (its value is given at launch)."""
    out: dict[str, tuple[str, str] | None] = {}
    for env, ref in options.secrets.items():
        if not _ENV_NAME.fullmatch(env):
            raise UserError(f"--secret {env}: not an environment variable name (use e.g. HF_TOKEN)")
        if options.engine == "skypilot":
            if ref:  # never echo it: it may be the secret itself
                raise UserError(
                    f"--secret {env}=...: SkyPilot takes the name alone (its value is passed at launch with "
                    f"`sky launch --secret {env}`); never a value here"
                )
            out[env] = None
            continue
        name, slash, key = ref.partition("/")
        if not ref:  # the Secret named after the variable, key `value`
            name, key = env.lower().replace("_", "-"), "value"
        elif not slash or not _K8S_NAME.fullmatch(name) or not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
            raise UserError(f"--secret {env}=...: give SECRET/KEY, a Kubernetes Secret's name and one of its keys")
        out[env] = (name, key)
    return out


def _instance(spec: JobSpec, options: ExportOptions) -> InstanceType:
    """The hardware `submit`'s resolution runs for: the accelerator asked for, or the catalog's
    instance type of the spec."""
    from .catalog import lookup

    if options.accelerator:
        return accelerator_instance(options.accelerator)
    if spec.instance != "local":
        return lookup(spec.instance)
    raise UserError(
        "export needs the hardware to resolve precision and strategy for: --accelerator A100:8 (L4:4, H100:8, "
        "cpu, ...) or --instance g5.12xlarge"
    )


def accelerator_instance(text: str) -> InstanceType:
    """An InstanceType standing for `MODEL[-NNGB]:COUNT` (SkyPilot's accelerator form) or `cpu`,
    with the catalog's compute capability and GPU memory for the model."""
    from .catalog import GPU_COMPUTE_CAPABILITY, InstanceType

    if text.strip().lower() == "cpu":
        return InstanceType("cpu", 0, 0, 0, None, None, 0, False, {})
    model, _, count = text.partition(":")
    base, _, memory = model.upper().partition("-")
    if base not in GPU_COMPUTE_CAPABILITY:
        raise UserError(
            f"--accelerator {text}: unknown GPU {model!r}; one of {', '.join(GPU_COMPUTE_CAPABILITY)} "
            "(or cpu), with a count: A100:8"
        )
    try:
        gpus = int(count or "1")
        gib = int(memory.removesuffix("GB")) if memory else 0
    except ValueError:
        raise UserError(f"--accelerator {text}: write MODEL:COUNT, e.g. A100:8 or A100-80GB:8") from None
    if gpus < 1:
        raise UserError(f"--accelerator {text}: give at least one GPU")
    known = gpu_memory_variants(base)
    if not gib and not known:
        raise UserError(f"--accelerator {text}: give the GPU's memory too, e.g. {base}-141GB:{gpus}")
    if gib and known and gib not in known:
        variants = " or ".join(f"{base}-{k}GB" for k in known)
        raise UserError(f"--accelerator {text}: {base} comes with {variants} here, not {gib} GB")
    return InstanceType(
        name=text,
        vcpus=0,
        memory_gib=0,
        gpus=gpus,
        gpu_model=base,
        compute_capability=GPU_COMPUTE_CAPABILITY[base],
        gpu_memory_gib=gib or known[0],  # the smaller variant unless named: the fit check errs safe
        efa=False,
        hourly_usd={},
    )


def gpu_memory_variants(model: str) -> list[int]:
    """The per-GPU memory (GB) of each variant of `model` the catalog has, smallest first."""
    from .catalog import all_instances

    return sorted({i.gpu_memory_gib for i in all_instances() if i.gpu_model == model})


def sky_accelerator(instance: InstanceType) -> str:
    """SkyPilot's name for the instance's GPUs: a memory variant other than the smallest is part of
    the name (SkyPilot's `A100` is the 40 GB part, `A100-80GB` the other), so the node gets the
    memory the fit check assumed."""
    model, gib = instance.gpu_model or "", instance.gpu_memory_gib
    variants = gpu_memory_variants(model)
    named = f"{model}-{gib}GB" if variants and gib != variants[0] else model
    return f"{named}:{instance.gpus}"


def _job_env(spec: JobSpec, options: ExportOptions, job_name: str, instance: InstanceType) -> dict[str, str]:
    from distrain_cloud.training.contract import PREFIX

    from .tracking import tracking_env

    kube = options.engine != "skypilot"
    # Relative folders land in the node's working folder (SkyPilot: the synced workdir); the
    # checkpoints go where every node sees them when --checkpoints names a bucket or volume.
    root = "distrain-job"
    if options.checkpoints:  # the bucket or volume every node mounts: one folder per job
        root = f"{SHARED if kube else SKY_BUCKET}/{job_name}"
    env = {
        f"{PREFIX}MODEL_DIR": f"{root}/model",
        f"{PREFIX}OUTPUT_DIR": f"{root}/output",
        f"{PREFIX}CHECKPOINT_DIR": f"{root}/checkpoints",
        f"{PREFIX}JOB_NAME": job_name,
        **tracking_env(lineage=job_name, instance=instance.name, image=options.image),
    }
    for channel in spec.inputs:
        env[f"{PREFIX}CHANNEL_{channel.upper()}"] = f"/data/{channel}"
    return env


def _skypilot(
    spec: JobSpec,
    options: ExportOptions,
    job_name: str,
    instance: InstanceType,
    command: list[str],
    env: dict[str, str],
    secrets: dict[str, tuple[str, str] | None],
) -> tuple[dict[str, Any], str, list[str]]:
    resources: dict[str, Any] = {}
    if instance.gpus:
        resources["accelerators"] = sky_accelerator(instance)
    else:
        resources["cpus"] = f"{max(options.processes or 1, 2)}+"
    if spec.region:
        resources["infra"] = f"aws/{spec.region}"
    if spec.spot:
        resources["use_spot"] = True
    if options.image:
        resources["image_id"] = f"docker:{options.image}"
    task: dict[str, Any] = {"name": job_name, "num_nodes": spec.nodes, "resources": resources}
    mounts: dict[str, Any] = {}
    setup = run_prefix = ""
    if not options.image:
        code, setup, run_prefix = _sky_code()
        task.update(code.pop("task", {}))
        mounts.update(code)
    if options.checkpoints:
        mounts[SKY_BUCKET] = {"source": options.checkpoints, "mode": "MOUNT_CACHED"}
    for channel, source in spec.inputs.items():
        mounts[f"/data/{channel}"] = {"source": source, "mode": "MOUNT"}
    if mounts:
        task["file_mounts"] = mounts
    task["envs"] = env
    if secrets:
        task["secrets"] = dict.fromkeys(secrets)
    if setup:
        task["setup"] = setup
    task["run"] = run_prefix + shlex.join(command) + "\n"
    notes = []
    if not options.checkpoints:
        notes.append(
            "checkpoints, model and outputs stay on each node's disk (lost with the node): --checkpoints "
            "s3://BUCKET/prefix keeps them in a bucket every node mounts"
        )
    launch = "sky jobs launch" if spec.spot else "sky launch -c " + job_name
    flags = "".join(f" --secret {name}" for name in secrets)
    return task, f"{launch}{flags} {job_name}.skypilot.yaml", notes


def _sky_code() -> tuple[dict[str, Any], str, str]:
    """How a SkyPilot node gets the code this launcher runs: (file mounts, plus the task's own keys
    under "task"; setup; a prefix of the run command). A checkout (an editable install) is synced
    as the task's workdir and installed there; an installed launcher's package folder is copied
    to SKY_CODE, and setup installs what `distrain-cloud[train]` would (the package's own metadata),
    so the node runs the very code installed here, from any folder, with no package index."""
    from .backends.cloud import repo_root

    root = repo_root()
    if (root / "pyproject.toml").is_file():
        return {"task": {"workdir": str(root)}}, "pip install -e '.[train]'\n", ""
    requirements = " ".join(shlex.quote(r) for r in train_requirements())
    setup = f"pip install {requirements}\n" if requirements else ""
    return {f"{SKY_CODE}/distrain_cloud": str(root)}, setup, f"cd {SKY_CODE} && "


def train_requirements() -> list[str]:
    """What `pip install distrain-cloud[train]` installs besides distrain-cloud itself, read from
    the installed package's metadata (its base requirements and the `train` extra's)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires("distrain-cloud") or []
    except PackageNotFoundError:
        return []
    kept = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        marker = marker.strip().replace("'", '"')
        if not marker or marker == 'extra == "train"':
            kept.append(requirement.strip())
    return kept


def _kubernetes(
    spec: JobSpec,
    options: ExportOptions,
    job_name: str,
    instance: InstanceType,
    command: list[str],
    env: dict[str, str],
    secrets: dict[str, tuple[str, str] | None],
    per_node: int,
) -> tuple[dict[str, Any], str, list[str]]:
    env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]
    for name, ref in secrets.items():
        assert ref is not None
        env_list.append({"name": name, "valueFrom": {"secretKeyRef": {"name": ref[0], "key": ref[1]}}})
    # Quantities are strings in Kubernetes' own types (its Python client writes them so).
    limits = {"nvidia.com/gpu": str(instance.gpus)} if instance.gpus else {"cpu": str(per_node)}
    claim = _CLAIM.fullmatch(options.checkpoints or "")
    volumes = [{"name": "shared", "persistentVolumeClaim": {"claimName": claim.group(1)}}] if claim else []
    mounts = [{"name": "shared", "mountPath": SHARED}] if claim else []
    notes = []
    if not claim:
        notes.append(
            "checkpoints stay in each pod's filesystem (lost with the pod): --checkpoints pvc:CLAIM puts them "
            "on a ReadWriteMany volume every pod mounts"
        )
    metadata = {"name": job_name, "labels": {"app.kubernetes.io/managed-by": "distrain-cloud"}}
    file = f"{job_name}.{options.engine}.yaml"
    if options.engine == "trainjob":
        trainer: dict[str, Any] = {
            "image": options.image,
            "command": command,
            "numNodes": spec.nodes,
            "numProcPerNode": per_node,
            "resourcesPerNode": {"limits": limits},
            "env": env_list,
        }
        job_spec: dict[str, Any] = {"runtimeRef": {"name": options.runtime}, "trainer": trainer}
        if "max_run" in spec.model_fields_set:
            job_spec["activeDeadlineSeconds"] = spec.max_run
        if claim:
            pod = {"volumes": volumes, "containers": [{"name": "node", "volumeMounts": mounts}]}
            patch = {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}
            job_spec["runtimePatches"] = [{"manager": "distrain-cloud", "trainingRuntimeSpec": {"template": patch}}]
        manifest = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": metadata}
        return {**manifest, "spec": job_spec}, f"kubectl apply -f {file}", notes
    container: dict[str, Any] = {
        "name": PYTORCHJOB_CONTAINER,
        "image": options.image,
        "command": command,
        "env": env_list,
        "ports": [{"name": PYTORCHJOB_PORT[0], "containerPort": PYTORCHJOB_PORT[1]}],
        "resources": {"limits": limits},
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {"containers": [container]}
    if volumes:
        pod_spec["volumes"] = volumes

    def replicas(count: int) -> dict[str, Any]:
        # ExitCode (training-operator's common_types.go): 1-127 fail the job, 128-255 restart the pod.
        # The entry point's bad input exits 2 (restarting cannot help); a stop or a killed process
        # exits 128 + its signal (a restart resumes from the checkpoint).
        return {"replicas": count, "restartPolicy": "ExitCode", "template": {"spec": pod_spec}}

    specs = {"Master": replicas(1)}
    if spec.nodes > 1:
        specs["Worker"] = replicas(spec.nodes - 1)
    # runPolicy: required by the operator's own SDK types (kubeflow-training 1.9), optional in its CRD.
    run_policy = {"activeDeadlineSeconds": spec.max_run} if "max_run" in spec.model_fields_set else {}
    job_spec = {"nprocPerNode": str(per_node), "pytorchReplicaSpecs": specs, "runPolicy": run_policy}
    manifest = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata, "spec": job_spec}
    return manifest, f"kubectl apply -f {file}", notes
