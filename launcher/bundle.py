"""The code bundle: a deterministic tar.gz of `training/` that ships the training code into a job.

Layout: every kept file under `<repo>/training/` sits at `distrain_cloud/training/<rel>`
(imported as `distrain_cloud.training`; `distrain_cloud` is a PEP 420 namespace package), plus
`requirements.txt` at the root when `training/requirements.txt` exists.

Kept: not matched by a `.gitignore` (the repo root's and any under training/; git semantics,
deeper files win) nor by ALWAYS_EXCLUDED (VCS, caches, virtualenvs incl. any dir with
pyvenv.cfg, .env files, keys, credentials). Symlinks: a link to a kept file inside `training/`
ships as a regular file with the target's content; links leaving `training/`, dangling
links and links to directories are skipped.

Same tree -> same bytes: sorted entries, mtime 0, uid/gid 0, empty owner names, modes
0o644 / 0o755 (exec bit kept), gzip header with mtime 0 and no file name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pathspec

from distrain_cloud.infra.errors import UserError

ARCHIVE_ROOT = "distrain_cloud/training"
# The job also runs infra's secret resolver (it imports only these siblings).
JOB_INFRA_FILES = ("__init__.py", "errors.py", "aws.py", "secret_env.py")
ALWAYS_EXCLUDED = (
    ".git", "__pycache__/", "*.pyc", ".venv/", "venv/", ".env", ".env.*", ".aws/",
    "*.pem", "*.key", "id_rsa*", "*.p12", "*.pfx", ".netrc", "credentials",
)  # fmt: skip
_ALWAYS = pathspec.GitIgnoreSpec.from_lines(ALWAYS_EXCLUDED)


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    size: int
    files: tuple[str, ...]  # archive paths of the regular files, sorted


def bundle_key(prefix: str, sha256: str) -> str:
    """Content-addressed S3 key of a bundle: `<prefix>/code/<sha256>.tar.gz`."""
    prefix = prefix.strip("/")
    return f"{prefix}/code/{sha256}.tar.gz" if prefix else f"code/{sha256}.tar.gz"


def _ignored(specs: list[tuple[str, pathspec.GitIgnoreSpec]], rel: str, is_dir: bool) -> bool:
    """Whether `rel` (relative to the repo root, '/'-separated) is excluded."""
    path = rel + "/" if is_dir else rel
    if _ALWAYS.match_file(path):
        return True
    verdict = False
    for base, spec in specs:  # root first, deeper .gitignore files later: the last match wins
        if base and not path.startswith(base + "/"):
            continue
        result = spec.check_file(path[len(base) + 1 :] if base else path)
        if result.include is not None:
            verdict = bool(result.include)
    return verdict


def _add_spec(specs: list[tuple[str, pathspec.GitIgnoreSpec]], base: str, directory: Path) -> None:
    if (directory / ".gitignore").is_file():
        specs.append((base, pathspec.GitIgnoreSpec.from_lines((directory / ".gitignore").read_text().splitlines())))


def _collect(repo_root: Path, top: Path) -> dict[str, Path]:
    """Map of path-relative-to-`top` -> file to read, for every kept file under `top`."""
    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = []
    _add_spec(specs, "", repo_root)
    real_top, kept = top.resolve(), {}
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        base = here.relative_to(repo_root).as_posix()
        _add_spec(specs, base, here)
        dirnames[:] = sorted(
            d for d in dirnames
            if not (here / d).is_symlink()
            and not (here / d / "pyvenv.cfg").exists()
            and not _ignored(specs, f"{base}/{d}", is_dir=True)
        )  # fmt: skip
        for name in filenames:
            path = here / name
            if _ignored(specs, f"{base}/{name}", is_dir=False):
                continue
            if path.is_symlink():
                target = path.resolve()
                if not target.is_file() or not target.is_relative_to(real_top):
                    continue
                rel_target = (top / target.relative_to(real_top)).relative_to(repo_root).as_posix()
                if _ignored(specs, rel_target, is_dir=False):
                    continue
            elif not path.is_file():
                continue  # sockets, fifos, ...
            kept[path.relative_to(top).as_posix()] = path
    return kept


def build_bundle(repo_root: Path) -> Bundle:
    """The deterministic tar.gz of `<repo_root>/training/`; same tree -> same bytes and sha256."""
    repo_root = Path(repo_root).absolute()
    top = repo_root / "training"
    if not top.is_dir():
        raise UserError(f"no training/ directory under {repo_root}: run from the distrain-cloud repository")
    sources = {f"{ARCHIVE_ROOT}/{rel}": path for rel, path in _collect(repo_root, top).items()}
    for name in JOB_INFRA_FILES:
        if (repo_root / "infra" / name).is_file():
            sources[f"distrain_cloud/infra/{name}"] = repo_root / "infra" / name
    if f"{ARCHIVE_ROOT}/requirements.txt" in sources:
        sources["requirements.txt"] = sources[f"{ARCHIVE_ROOT}/requirements.txt"]
    dirs = {parent.as_posix() for name in sources for parent in Path(name).parents} - {"."}

    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="", compresslevel=9) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(dirs | set(sources)):
                info = tarfile.TarInfo(name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if name in dirs:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    content = sources[name].read_bytes()  # through a symlink: the target's bytes
                    info.size, info.mode = len(content), 0o755 if os.stat(sources[name]).st_mode & 0o111 else 0o644
                    tar.addfile(info, io.BytesIO(content))
    data = raw.getvalue()
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), size=len(data), files=tuple(sorted(sources)))
