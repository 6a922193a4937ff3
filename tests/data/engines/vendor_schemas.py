"""Write SkyPilot's task schema, which tests/launcher/test_export.py validates exports against.

Not run by the tests: run by hand when SkyPilot's version changes, and commit what it writes. It
needs SkyPilot itself, which is heavy (a server stack, and click below what typer needs): a venv
of its own.

    python -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot==0.14.1
    /tmp/sky/bin/python tests/data/engines/vendor_schemas.py

Descriptions are dropped (they validate nothing); every other keyword is kept as SkyPilot wrote
it. The Kubernetes manifests are checked with the operators' own Python packages instead
(kubeflow-trainer-api, kubeflow-training: the dev extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def write(name: str, source: str, schema: dict[str, Any], **extra: Any) -> None:
    out = HERE / f"{name}.schema.json"
    document = {"source": source, **extra, "schema": without_descriptions(schema)}
    out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")


def skypilot() -> None:
    import sky
    from sky.utils import schemas

    version, commit = sky.__version__, getattr(sky, "__commit__", "unknown")
    source = f"skypilot {version} (PyPI; commit {commit}) sky/utils/schemas.py get_task_schema()"
    # Task.from_yaml_config validates the task with the first, then its `resources` with the second
    # (sky/resources.py) and each bucket in `file_mounts` with the third (sky/data/storage.py).
    extra = {"resources_schema": schemas.get_resources_schema(), "storage_schema": schemas.get_storage_schema()}
    write("skypilot-task", source, schemas.get_task_schema(), **without_descriptions(extra))


if __name__ == "__main__":
    skypilot()
