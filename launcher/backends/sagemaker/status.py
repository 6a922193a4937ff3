"""A SageMaker job's status, read from DescribeTrainingJob's answer (shown, never obeyed: a status
newer than this code counts as still running), and the host behind each of its log streams."""

from __future__ import annotations

from enum import Enum
from typing import Any


class TrainingJobStatus(str, Enum):
    InProgress = "InProgress"
    Completed = "Completed"
    Failed = "Failed"
    Stopping = "Stopping"
    Stopped = "Stopped"
    Deleting = "Deleting"  # an ended job being deleted


TERMINAL = frozenset(
    {TrainingJobStatus.Completed, TrainingJobStatus.Failed, TrainingJobStatus.Stopped, TrainingJobStatus.Deleting}
)
# What a secondary status means, for `status` when SageMaker gives no FailureReason.
SECONDARY_DETAIL = {
    "Interrupted": "spot capacity was reclaimed; SageMaker restarts the job when capacity returns and it resumes "
    "from its last checkpoint",
    "MaxWaitTimeExceeded": "spot capacity did not come (and the job did not finish) within --max-wait; raise "
    "--max-wait, or use --on-demand",
    "MaxRuntimeExceeded": "the job ran past --max-run and was stopped; its checkpoints remain (resume with "
    "resume_from)",
}


def status_of(job_name: str, job: dict[str, Any]) -> dict[str, Any]:
    status = job["TrainingJobStatus"]
    secondary = job.get("SecondaryStatus")
    resources = job.get("ResourceConfig") or {}
    return {
        "job_name": job_name,
        "status": status,
        "secondary_status": secondary,
        # a status newer than this code is taken as still running: `wait` keeps polling
        "terminal": status in {s.value for s in TERMINAL},
        "instance": f"{resources.get('InstanceCount', '?')} x {resources.get('InstanceType', '?')}",
        "created": str(job.get("CreationTime", "")),
        "detail": job.get("FailureReason") or SECONDARY_DETAIL.get(secondary or "", ""),
        "billable_seconds": job.get("BillableTimeInSeconds"),
        "model_artifacts": (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts"),
        "checkpoints": (job.get("CheckpointConfig") or {}).get("S3Uri"),
    }


def host_of(stream: str) -> str:
    # "<job>/algo-2-1732600000" -> "algo-2"
    return stream.split("/", 1)[-1].rsplit("-", 1)[0]
