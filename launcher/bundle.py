"""The code bundle: a deterministic tar.gz of `training/` that ships the training code into a job.

Layout: every kept file under `<repo>/training/` sits at `distrain_cloud/training/<rel>`
(imported as `distrain_cloud.training`; `distrain_cloud` is a PEP 420 namespace package), plus
`requirements.txt` at the root when `training/requirements.txt` exists, infra's secret resolver,
and the EC2 node agent (`launcher/backends/ec2/agent/` and the files it imports).

Kept: not matched by a `.gitignore` (the repo root's and any under training/; git semantics,
deeper files win) nor by ALWAYS_EXCLUDED (VCS, caches, virtualenvs incl. any dir with
pyvenv.cfg, and the credential files and folders it lists by family), which no `.gitignore`
can re-include. Symlinks: a link to a kept file inside `training/` ships as a regular file with
the target's content; links leaving `training/`, dangling links and links to directories are skipped.

Size: a file over MAX_FILE_SIZE is refused (UserError naming it) unless `allow_large` lists it,
so a stray data set or checkpoint is not uploaded with every job by accident.

Same tree -> same bytes: sorted entries, mtime 0, uid/gid 0, empty owner names, modes
0o644 / 0o755 (exec bit kept), gzip header with mtime 0 and no file name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pathspec

from distrain_cloud.infra.errors import UserError

ARCHIVE_ROOT = "distrain_cloud/training"
# The job also runs infra's secret resolver (it imports only these siblings).
JOB_INFRA_FILES = ("__init__.py", "errors.py", "aws.py", "secret_env.py")
# An EC2 node runs its agent from the bundle (`python -m`, backends/ec2/user_data.py: NODE_AGENT):
# the agent's folder, the key layout it shares with the launcher, and the light package files above
# them (the agent imports nothing else of the launcher).
NODE_AGENT_DIR = "launcher/backends/ec2/agent"
NODE_AGENT_FILES = (
    "launcher/__init__.py",
    "launcher/backends/__init__.py",
    "launcher/backends/ec2/__init__.py",
    "launcher/backends/ec2/layout.py",
)
# Never shipped, whatever a .gitignore says. Gitignore syntax, matched against paths relative to the
# repo root: a pattern with a "/" before its end is anchored there, hence the "**/" prefixes. Matches are
# dropped silently (Bundle.listing shows what does ship). One pattern per name: a test checks that each
# one excludes a path that no other pattern does, so none can be removed unnoticed.
ALWAYS_EXCLUDED = (
    # not code: version control, caches, virtualenvs (a folder holding pyvenv.cfg is skipped too)
    ".git", "__pycache__/", "*.pyc", ".venv/", "venv/",
    # ssh and other private keys: ssh/gpg folders, id_<type> keys of every type (with their _sk and
    # .pub variants), key and keystore files
    ".ssh/", ".gnupg/", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "id_xmss*",
    "*.pem", "*.key", "*.ppk", "*.p8", "*.p12", "*.pfx", "*.jks", "*.keystore",
    # cloud: AWS (folder, shared credentials file, s3cmd, boto), gcloud (config folder, ADC), Azure
    ".aws/", "credentials", ".s3cfg", ".boto",
    "**/.config/gcloud/", "application_default_credentials.json", ".azure/",
    # container registries and package indexes (`.gem/credentials` and `.cargo/credentials` fall
    # under `credentials` above)
    "**/.docker/config.json", ".pypirc", "pip.conf", ".npmrc", ".yarnrc*", "**/.cargo/credentials.toml",
    # git hosts, and whatever else reads .netrc (W&B keeps its API key there)
    ".git-credentials", ".netrc", "_netrc", "**/.config/gh/",
    # Hugging Face Hub tokens: the old folder, the token files under HF_HOME, hand-made token files
    ".huggingface/", "**/huggingface/token", "**/huggingface/stored_tokens", "hf_token", ".hf_token",
    "hf_token.txt",
    # Kubernetes
    ".kube/", "kubeconfig", "*.kubeconfig",
    # environment files: .env, .env.local, .envrc, ...
    ".env*",
)  # fmt: skip
_ALWAYS = pathspec.GitIgnoreSpec.from_lines(ALWAYS_EXCLUDED)
# Per file, before compression. Code, configs and tokenizers are far smaller; a bigger file is usually
# data or a checkpoint that belongs in an input channel, not in a bundle uploaded with every job.
MAX_FILE_SIZE = 20 * 1024 * 1024
ALLOW_LARGE_OPTION = "bundle.allow_large"  # how users name build_bundle's allow_large, in messages


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    size: int  # of the tar.gz
    files: tuple[str, ...]  # archive paths of the regular files, sorted
    file_sizes: tuple[int, ...]  # bytes of each file, uncompressed, in the order of `files`

    def listing(self) -> str:
        """One line per file (size, archive path), then the totals; for `--dry-run --bundle-files`."""
        lines = [f"{_human(size):>10}  {name}" for name, size in zip(self.files, self.file_sizes, strict=True)]
        total = _human(sum(self.file_sizes))
        lines.append(f"{len(self.files)} files, {total} ({_human(self.size)} compressed), sha256 {self.sha256}")
        return "\n".join(lines)


def _human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


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


def _check_sizes(repo_root: Path, sources: dict[str, Path], allow_large: Sequence[str]) -> None:
    """Refuse files over MAX_FILE_SIZE that `allow_large` does not list, and entries of it naming nothing."""
    if isinstance(allow_large, str):  # one path, not a sequence of one-letter paths
        allow_large = (allow_large,)
    repo_paths = sorted({path.relative_to(repo_root).as_posix() for path in sources.values()})
    # as users write them: "./training/x", "training\\x" and "training/assets/" (a folder) all work
    allowed = [PurePosixPath(entry.replace("\\", "/")).as_posix() for entry in allow_large]

    def is_allowed(rel: str, entry: str) -> bool:
        return rel == entry or rel.startswith(entry + "/")

    for entry, written in zip(allowed, allow_large, strict=True):
        if not any(is_allowed(rel, entry) for rel in repo_paths):
            raise UserError(
                f"{ALLOW_LARGE_OPTION} lists '{written}', which names no file in the code bundle (missing, "
                f"gitignored or a credential file): write paths from the repository root, e.g. training/assets/x.bin"
            )
    sizes = {rel: os.stat(repo_root / rel).st_size for rel in repo_paths}  # through a symlink: the target's
    too_big = [
        rel
        for rel, size in sizes.items()
        if size > MAX_FILE_SIZE and not any(is_allowed(rel, entry) for entry in allowed)
    ]
    if too_big:
        one = len(too_big) == 1
        them, named = "it" if one else "them", ", ".join(f"{rel} ({_human(sizes[rel])})" for rel in too_big)
        raise UserError(
            f"code bundle: {named} {'is' if one else 'are'} over the {_human(MAX_FILE_SIZE)} per-file limit: "
            f"move {them} out of training/ or add {them} to .gitignore (data belongs in an input channel), "
            f"or list {', '.join(too_big)} under {ALLOW_LARGE_OPTION} to ship {them} anyway"
        )


def build_bundle(repo_root: Path, *, allow_large: Sequence[str] = ()) -> Bundle:
    """The deterministic tar.gz of `<repo_root>/training/`; same tree -> same bytes and sha256.

    `allow_large`: paths relative to `repo_root` (files, or folders for everything below them) that may
    exceed MAX_FILE_SIZE. Raises UserError for a bigger file not listed, or an entry that names no
    file in the bundle.
    """
    repo_root = Path(repo_root).absolute()
    top = repo_root / "training"
    if not top.is_dir():
        raise UserError(f"no training/ directory under {repo_root}: run from the distrain-cloud repository")
    sources = {f"{ARCHIVE_ROOT}/{rel}": path for rel, path in _collect(repo_root, top).items()}
    for name in JOB_INFRA_FILES:
        if (repo_root / "infra" / name).is_file():
            sources[f"distrain_cloud/infra/{name}"] = repo_root / "infra" / name
    agent = repo_root / NODE_AGENT_DIR
    for rel in (*NODE_AGENT_FILES, *(f"{NODE_AGENT_DIR}/{f.name}" for f in sorted(agent.glob("*.py")))):
        if (repo_root / rel).is_file():
            sources[f"distrain_cloud/{rel}"] = repo_root / rel
    if f"{ARCHIVE_ROOT}/requirements.txt" in sources:
        sources["requirements.txt"] = sources[f"{ARCHIVE_ROOT}/requirements.txt"]
    _check_sizes(repo_root, sources, allow_large)  # before reading anything
    dirs = {parent.as_posix() for name in sources for parent in Path(name).parents} - {"."}

    raw = io.BytesIO()
    sizes: dict[str, int] = {}
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="", compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
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
                sizes[name] = len(content)
    data = raw.getvalue()
    files = tuple(sorted(sources))
    return Bundle(
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        files=files,
        file_sizes=tuple(sizes[name] for name in files),
    )
