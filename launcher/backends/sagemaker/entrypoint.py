"""How a SageMaker job starts: unpack the code bundle, then run the job script it carries.

The script itself (`training/job_entry.sh`: requirements, PYTHONPATH, secrets, node launcher)
travels in the bundle, so what the request carries is one short line: the ContainerEntrypoint.
(EC2's user data fetches the bundle itself and hands over to the node agent: ec2/user_data.py.)
"""

from __future__ import annotations

from ...bundle import ARCHIVE_ROOT

JOB_SCRIPT = f"{ARCHIVE_ROOT}/job_entry.sh"  # its path inside the unpacked bundle
# The container's root; overridden only to rehearse a job outside SageMaker (tests).
SAGEMAKER_ROOT = "${DISTRAIN_SAGEMAKER_ROOT:-/opt/ml}"


def unpack_and_run(archive_glob: str, code_dir: str, script_args: str) -> str:
    """One shell line: unpack the bundle into `code_dir` and hand over to its job script."""
    return (
        f'mkdir -p "{code_dir}" && tar -xzf {archive_glob} -C "{code_dir}" && '
        f'exec bash "{code_dir}/{JOB_SCRIPT}" {script_args}'
    )


def sagemaker_entrypoint(code_channel: str) -> list[str]:
    """The ContainerEntrypoint: SageMaker puts the bundle in the code channel's folder."""
    line = unpack_and_run(
        f'"$R"/input/data/{code_channel}/*.tar.gz',
        "$R/code",
        '--hyperparameters "$R/input/config/hyperparameters.json"',
    )
    return ["/bin/bash", "-c", f"R={SAGEMAKER_ROOT}; {line}"]
