"""launcher.bundle: deterministic, filtered tar.gz of training/."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pathspec
import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher import bundle as bundle_module
from distrain_cloud.launcher.bundle import ALWAYS_EXCLUDED, MAX_FILE_SIZE, build_bundle, bundle_key

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
    assert dict(zip(bundle.files, bundle.file_sizes, strict=True))["requirements.txt"] == len(b"transformers>=4.46\n")
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


# One path per pattern of ALWAYS_EXCLUDED at least, each matched by that pattern alone (checked below), so
# removing any pattern makes one of these ship and its test fail. Paths are relative to the repo root.
EXCLUDED_BY_FAMILY = {
    "not code": [
        "training/.git/config",
        "training/__pycache__/notes.txt",
        "training/sub/stale.pyc",
        "training/.venv/lib/site.py",
        "training/venv/bin/python",
    ],
    "ssh and private keys": [
        "training/.ssh/config",
        "training/.ssh/id_ecdsa",
        "training/.gnupg/pubring.kbx",
        "training/id_rsa",
        "training/keys/id_dsa",
        "training/id_ecdsa_sk",
        "training/id_ed25519",
        "training/id_ed25519_sk.pub",
        "training/id_xmss",
        "training/server.pem",
        "training/tls.key",
        "training/putty.ppk",
        "training/AuthKey_TEST.p8",
        "training/cert.p12",
        "training/cert.pfx",
        "training/store.jks",
        "training/release.keystore",
    ],
    "cloud": [
        "training/.aws/config",
        "training/sub/credentials",
        "training/.s3cfg",
        "training/.boto",
        "training/.config/gcloud/credentials.db",
        "training/application_default_credentials.json",
        "training/.azure/msal_token_cache.json",
    ],
    "registries and package indexes": [
        "training/.docker/config.json",
        "training/.pypirc",
        "training/pip.conf",
        "training/.npmrc",
        "training/.yarnrc.yml",
        "training/.gem/credentials",
        "training/.cargo/credentials.toml",
    ],
    "git": ["training/.git-credentials", "training/.netrc", "training/_netrc", "training/.config/gh/hosts.yml"],
    "hugging face hub": [
        "training/.huggingface/token",
        "training/.cache/huggingface/token",
        "training/.cache/huggingface/stored_tokens",
        "training/hf_token",
        "training/.hf_token",
        "training/hf_token.txt",
    ],
    "kubernetes": ["training/.kube/config", "training/kubeconfig", "training/prod.kubeconfig"],
    "environment files": ["training/.env", "training/.env.local", "training/.envrc"],
}
EXCLUDED = [(family, path) for family, paths in EXCLUDED_BY_FAMILY.items() for path in paths]
FAKE = "FAKE-CREDENTIAL-placeholder"


def _tree(root: Path, files: dict[str, str | int]) -> Path:
    """Write `files` (repo-relative path -> text, or a size for a sparse file) under `root`."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, int):
            with path.open("wb") as f:
                f.truncate(content)  # sparse: no disk, no time
        else:
            path.write_text(content)
    return root


@pytest.mark.parametrize(("family", "path"), EXCLUDED, ids=[path.removeprefix("training/") for _, path in EXCLUDED])
def test_credential_files_never_ship(tmp_path, family, path):
    repo = _tree(tmp_path, {"training/__init__.py": "", path: f"{FAKE} {family}\n"})
    bundle = build_bundle(repo)
    assert bundle.files == (f"{ROOT}/__init__.py",)
    assert FAKE.encode() not in gzip.decompress(bundle.data)


def test_every_excluded_pattern_is_tested_alone():
    def match(patterns, path):
        return pathspec.GitIgnoreSpec.from_lines(patterns).match_file(path)

    paths = [path for _, path in EXCLUDED]
    for pattern in ALWAYS_EXCLUDED:
        others = [p for p in ALWAYS_EXCLUDED if p != pattern]
        assert any(match([pattern], path) and not match(others, path) for path in paths), pattern


def test_gitignore_cannot_reinclude_credentials_and_near_names_ship(tmp_path):
    near = [
        "environment.py",
        "tokens.py",
        "keys.py",
        "id_utils.py",
        "hf_token_utils.py",
        "credentials_check.py",
        "kube.py",
        "config.json",
        "docker/config.json",
        "huggingface/tokenizer.json",
        "git_info.py",
    ]
    repo = _tree(
        tmp_path,
        {
            "training/.gitignore": "!.npmrc\n!.ssh/\n",
            "training/.npmrc": FAKE,
            "training/.ssh/id_ed25519": FAKE,
            **{f"training/{rel}": "" for rel in near},
        },
    )
    bundle = build_bundle(repo)
    assert set(bundle.files) == {f"{ROOT}/{rel}" for rel in [".gitignore", *near]}
    assert FAKE.encode() not in gzip.decompress(bundle.data)


def test_file_over_the_size_limit_is_refused(tmp_path):
    repo = _tree(
        tmp_path,
        {
            "training/__init__.py": "",
            "training/assets/big.bin": MAX_FILE_SIZE + 1,
            "training/assets/at-limit.bin": MAX_FILE_SIZE,
        },
    )
    with pytest.raises(UserError) as error:
        build_bundle(repo)
    message = str(error.value)
    assert "\n" not in message and "at-limit" not in message
    assert message.startswith("code bundle: training/assets/big.bin (20.0 MiB) is over the 20.0 MiB per-file limit: ")
    assert "move it out of training/ or add it to .gitignore" in message
    assert message.endswith("or list training/assets/big.bin under bundle.allow_large to ship it anyway")


@pytest.fixture
def small_limit(monkeypatch) -> int:
    monkeypatch.setattr(bundle_module, "MAX_FILE_SIZE", 1024)
    return 1024


def test_allow_large_lets_listed_files_through(tmp_path, small_limit):
    repo = _tree(
        tmp_path,
        {
            "training/__init__.py": "",
            "training/assets/big.bin": "x" * 4096,
            "training/data/part-1.bin": "y" * 3000,
            "training/data/part-2.bin": "z" * 2048,
            "training/edge.txt": "e" * small_limit,
        },
    )
    with pytest.raises(
        UserError,
        match=r"^code bundle: training/assets/big.bin \(4.0 KiB\), training/data/part-1.bin "
        r"\(2.9 KiB\), training/data/part-2.bin \(2.0 KiB\) are over the 1.0 KiB ",
    ):
        build_bundle(repo)
    with pytest.raises(UserError, match=r"^code bundle: training/assets/big.bin \(4.0 KiB\) is over"):
        build_bundle(repo, allow_large=["training/data/"])  # a folder allows everything below it
    bundle = build_bundle(repo, allow_large=["./training/data", "training/assets/big.bin"])
    sizes = dict(zip(bundle.files, bundle.file_sizes, strict=True))
    assert sizes[f"{ROOT}/assets/big.bin"] == 4096 and sizes[f"{ROOT}/data/part-1.bin"] == 3000
    assert sizes[f"{ROOT}/edge.txt"] == small_limit  # at the limit is within it
    assert build_bundle(repo, allow_large=("training/data", "training/assets/big.bin")) == bundle


@pytest.mark.parametrize("entry", ["assets/big.bin", "training/missing.bin", "training/.env", "training/a"])
def test_allow_large_entry_naming_no_bundled_file_is_refused(tmp_path, small_limit, entry):
    repo = _tree(
        tmp_path,
        {
            "training/__init__.py": "",
            "training/assets/big.bin": "x" * 4096,
            "training/abc.py": "",
            "training/.env": FAKE,
        },
    )
    with pytest.raises(UserError) as error:
        build_bundle(repo, allow_large=["training/assets/big.bin", entry])
    assert str(error.value).startswith(f"bundle.allow_large lists '{entry}', which names no file in the code bundle")
    assert f"{ROOT}/assets/big.bin" in build_bundle(repo, allow_large="training/assets/big.bin").files  # one str


def test_listing_shows_every_file_with_its_size(repo):
    bundle = build_bundle(repo)
    lines = bundle.listing().splitlines()
    assert all(size < 1024 for size in bundle.file_sizes)  # all shown in bytes
    assert lines[:-1] == [f"{size:>8} B  {name}" for name, size in zip(bundle.files, bundle.file_sizes, strict=True)]
    assert "       0 B  distrain_cloud/training/__init__.py" in lines and "      19 B  requirements.txt" in lines
    assert lines[-1] == (
        f"{len(bundle.files)} files, {sum(bundle.file_sizes)} B ({bundle.size} B compressed), sha256 {bundle.sha256}"
    )


def test_the_node_agent_imports_from_the_bundle_alone(tmp_path):
    """What an EC2 node runs (`python -m` NODE_AGENT) imports from the unpacked bundle with no site
    packages at all (-S: no installed distrain_cloud, no editable finder to fall back on), so an
    import of a launcher module the bundle does not carry fails here, not on a node."""
    import subprocess
    import sys

    from distrain_cloud.launcher.backends.ec2.user_data import NODE_AGENT

    with tarfile.open(fileobj=io.BytesIO(build_bundle(REPO).data)) as tar:
        tar.extractall(tmp_path, filter="data")
    # the entry and every part it imports only when a job asks for it (a lineage, a cost cap)
    parts = ", ".join(f"{NODE_AGENT}.{name}" for name in ("run", "node", "elastic", "costclock"))
    probe = f"import sys, {parts}; print(sorted(m for m in sys.modules if m.startswith('distrain_cloud')))"
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "distrain_cloud.launcher.backends.ec2.agent.run" in done.stdout
