"""launcher.bundle: deterministic, filtered tar.gz of training/."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher.bundle import build_bundle, bundle_key

REPO = Path(__file__).resolve().parents[2]
ROOT = "distrain_cloud/training"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A fake repository with a training/ tree full of things that must not ship."""
    files = {
        ".gitignore": "/runs/\n*.log\n",
        "README.md": "not shipped: outside training/\n",
        "training/__init__.py": "",
        "training/strategies.py": "STRATEGIES = {}\n",
        "training/requirements.txt": "transformers>=4.46\n",
        "training/assets/tokenizer.json": "{}\n",
        "training/run.sh": "#!/bin/sh\necho hi\n",
        "training/.gitignore": "scratch/\n*.tmp\n!keep.tmp\n",
        "training/scratch/notes.txt": "gitignored dir\n",
        "training/junk.tmp": "gitignored file\n",
        "training/keep.tmp": "re-included by !keep.tmp\n",
        "training/train.log": "ignored by the root .gitignore\n",
        "training/sub/.gitignore": "local.txt\n",
        "training/sub/local.txt": "ignored by a nested .gitignore\n",
        "training/sub/mod.py": "X = 1\n",
        "training/.env": "HF_TOKEN=hf_secret\n",
        "training/.env.local": "WANDB_API_KEY=secret\n",
        "training/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
        "training/id_rsa.pub": "ssh-ed25519 AAAA\n",
        "training/server.pem": "pem\n",
        "training/tls.key": "key\n",
        "training/cert.p12": "p12\n",
        "training/.netrc": "machine x password y\n",
        "training/sub/credentials": "[default]\n",
        "training/.venv/lib/site.py": "venv\n",
        "training/venv/bin/python": "venv\n",
        "training/myenv/pyvenv.cfg": "home = /usr/bin\n",
        "training/myenv/lib/x.py": "venv\n",
        "training/__pycache__/strategies.cpython-311.pyc": "bytecode\n",
        "training/sub/stale.pyc": "bytecode\n",
        "training/.git/config": "[core]\n",
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "training/run.sh").chmod(0o755)
    (tmp_path / "training/passwd").symlink_to("/etc/passwd")  # leaves the tree: skipped
    (tmp_path / "training/readme-link").symlink_to(tmp_path / "README.md")  # leaves training/: skipped
    (tmp_path / "training/alias.py").symlink_to("strategies.py")  # inside: stored as a regular file
    (tmp_path / "training/env-alias").symlink_to(".env")  # inside, but to an excluded file: skipped
    (tmp_path / "training/dangling").symlink_to("missing.py")
    (tmp_path / "training/linkdir").symlink_to(tmp_path / "training/sub", target_is_directory=True)
    return tmp_path


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def _read(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.extractfile(name).read()


def test_contents_and_exclusions(repo):
    bundle = build_bundle(repo)
    assert bundle.files == tuple(sorted(bundle.files))
    kept = [".gitignore", "__init__.py", "alias.py", "assets/tokenizer.json", "keep.tmp",
            "requirements.txt", "run.sh", "strategies.py", "sub/.gitignore", "sub/mod.py"]  # fmt: skip
    # everything else in the fixture is excluded (id_rsa* covers id_rsa.pub too)
    assert set(bundle.files) == {f"{ROOT}/{rel}" for rel in kept} | {"requirements.txt"}
    members = _members(bundle.data)
    assert set(bundle.files) == {n for n, m in members.items() if m.isfile()}
    assert {n for n, m in members.items() if m.isdir()} == {"distrain_cloud", ROOT, f"{ROOT}/assets", f"{ROOT}/sub"}
    assert all(n.startswith(f"{ROOT}/") or n in ("distrain_cloud", ROOT, "requirements.txt") for n in members)
    # a symlink inside the tree ships as a regular file with the target's content
    assert members[f"{ROOT}/alias.py"].isfile() and _read(bundle.data, f"{ROOT}/alias.py") == b"STRATEGIES = {}\n"
    assert _read(bundle.data, "requirements.txt") == b"transformers>=4.46\n"
    assert b"hf_secret" not in gzip.decompress(bundle.data) and b"root:" not in gzip.decompress(bundle.data)


def test_normalised_metadata(repo):
    bundle = build_bundle(repo)
    assert bundle.size == len(bundle.data)
    header = bundle.data[:10]
    assert header[:3] == b"\x1f\x8b\x08" and header[3] == 0 and header[4:8] == b"\0\0\0\0"  # no FNAME, mtime 0
    for name, info in _members(bundle.data).items():
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname) == (0, 0, 0, "", "")
        expected = 0o755 if info.isdir() or name.endswith("run.sh") else 0o644
        assert info.mode == expected, name


def test_deterministic_and_mtime_independent(repo):
    first = build_bundle(repo)
    assert build_bundle(repo) == first
    for path in (repo / "training").rglob("*"):
        if not path.is_symlink():
            os.utime(path, (1_000_000_000, 1_000_000_000))
    again = build_bundle(repo)
    assert again.data == first.data and again.sha256 == first.sha256


def test_changes_change_the_hash(repo):
    first = build_bundle(repo)
    (repo / "training/new.py").write_text("NEW = 1\n")
    added = build_bundle(repo)
    assert added.sha256 != first.sha256 and f"{ROOT}/new.py" in added.files
    (repo / "training/new.py").write_text("NEW = 2\n")
    assert build_bundle(repo).sha256 != added.sha256
    (repo / "training/junk2.tmp").write_text("ignored\n")  # a gitignored file changes nothing
    assert build_bundle(repo).sha256 == build_bundle(repo).sha256


def test_no_requirements_and_missing_training(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "training/a.py").write_text("")
    assert build_bundle(tmp_path).files == (f"{ROOT}/a.py",)
    with pytest.raises(UserError, match="no training/ directory"):
        build_bundle(tmp_path / "elsewhere")


def test_bundle_key():
    assert bundle_key("runs/job-1", "ab" * 32) == f"runs/job-1/code/{'ab' * 32}.tar.gz"
    assert bundle_key("/runs/", "cd") == "runs/code/cd.tar.gz"
    assert bundle_key("", "cd") == "code/cd.tar.gz"


def test_real_repository():
    bundle = build_bundle(REPO)
    assert f"{ROOT}/strategies.py" in bundle.files
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in bundle.files)
    assert build_bundle(REPO).sha256 == bundle.sha256
