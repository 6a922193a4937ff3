"""A local stand-in for the Hugging Face Hub HTTP API, enough for `HfApi.create_repo` and
`HfApi.upload_folder` (huggingface_hub 2.4) to push small files, to main or to a branch
`HfApi.create_branch` made.

    with HubDouble() as hub:
        HfApi(endpoint=hub.url, token="hf_fake").upload_folder(...)
        assert hub.files("org/model")["config.json"] == b"..."

Every file is answered as a "regular" git file at preupload, so huggingface_hub sends its
content base64-encoded inside the commit request and never takes the LFS or Xet path
(which the real Hub picks for *.safetensors and for large files; this double does not
implement it and refuses `lfsFile` commit entries). Requests are recorded as they arrived.

Endpoints:
    POST /api/repos/create                          create_repo (409 when it exists)
    POST /api/validate-yaml                         README.md metadata check before upload
    POST /api/{type}s/{repo_id}/branch/{branch}     create_branch (from main's head; 409 when it exists)
    POST /api/{type}s/{repo_id}/preupload/{rev}     upload mode of each file
    POST /api/{type}s/{repo_id}/commit/{rev}        NDJSON commit with base64 files, to branch rev
    GET  /api/{type}s/{repo_id}[/revision/{rev}]    repo_info (after an unchanged upload)
Anything else is answered 404 and listed in `unhandled`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

REPO_TYPES = ("model", "dataset", "space")
_REPO_API = re.compile(
    r"^/api/(?P<type>models|datasets|spaces)/(?P<repo>[^/]+(?:/[^/]+)?)"
    r"(?:/(?P<action>preupload|commit|revision|branch)/(?P<rev>[^/]+))?$"
)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # as sent, query string included
    headers: tuple[tuple[str, str], ...]  # as sent, in order
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self):
        return json.loads(self.body)


@dataclass
class Commit:
    oid: str
    summary: str
    description: str
    parent: str | None


@dataclass
class Branch:
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)

    @property
    def head(self) -> str:
        return self.commits[-1].oid if self.commits else "0" * 40


@dataclass
class Repo:
    """A repo's branches; `files`, `commits` and `head` are main's."""

    repo_id: str
    repo_type: str
    private: bool
    branches: dict[str, Branch] = field(default_factory=lambda: {"main": Branch()})

    @property
    def files(self) -> dict[str, bytes]:
        return self.branches["main"].files

    @property
    def commits(self) -> list[Commit]:
        return self.branches["main"].commits

    @property
    def head(self) -> str:
        return self.branches["main"].head


def git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class HubDouble:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.unhandled: list[RecordedRequest] = []
        self.repos: dict[tuple[str, str], Repo] = {}
        # Endpoint name ("create", "validate-yaml", "branch", "preupload", "commit", "info") ->
        # (status, message): answer that error instead, to test failure handling.
        self.fail: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        assert self._server is not None, "HubDouble is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubDouble:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="hub-double", daemon=True
        )  # a short poll interval makes stop() quick
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    def __enter__(self) -> HubDouble:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ assertions

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        return self.repos[(repo_type, repo_id)]

    def files(self, repo_id: str, repo_type: str = "model", branch: str = "main") -> dict[str, bytes]:
        return dict(self.repo(repo_id, repo_type).branches[branch].files)

    # ------------------------------------------------------------ endpoints

    def handle(self, request: RecordedRequest) -> tuple[int, dict]:
        """Returns (status, JSON body) or raises HubError; called with the lock held."""
        path = urlsplit(request.path).path
        if request.method == "POST" and path == "/api/repos/create":
            return self._create(request)
        if request.method == "POST" and path == "/api/validate-yaml":
            self._maybe_fail("validate-yaml")
            return 200, {"errors": [], "warnings": []}
        match = _REPO_API.match(path)
        if match:
            repo_type = match["type"][:-1]
            repo = self._find(repo_type, unquote(match["repo"]))
            action, rev = match["action"], unquote(match["rev"] or "main")
            if request.method == "GET" and action in (None, "revision"):
                return self._info(repo, rev)
            if request.method == "POST" and action == "branch":
                return self._create_branch(repo, rev, request)
            if request.method == "POST" and action in ("preupload", "commit"):
                branch = repo.branches.get(rev)
                if branch is None:
                    raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
                if action == "preupload":
                    return self._preupload(branch, request)
                return self._commit(repo, branch, request)
        self.unhandled.append(request)
        raise HubError(404, f"HubDouble does not implement {request.method} {path}")

    def _maybe_fail(self, endpoint: str) -> None:
        if endpoint in self.fail:
            raise HubError(*self.fail[endpoint])

    def _find(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _create(self, request: RecordedRequest):
        self._maybe_fail("create")
        payload = request.json()
        repo_type = payload.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"Invalid repo type: {repo_type}")
        name, org = payload["name"], payload.get("organization")
        repo_id = f"{org}/{name}" if org else name
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.url}/{prefix}{repo_id}"
        if (repo_type, repo_id) in self.repos:
            return 409, {"error": f"You already created this {repo_type} repo", "url": url}
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        self.repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, private)
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def _create_branch(self, repo: Repo, name: str, request: RecordedRequest):
        self._maybe_fail("branch")
        if name in repo.branches:
            raise HubError(409, f"Reference already exists: refs/heads/{name}")
        if name.startswith("refs/"):
            raise HubError(400, f"Invalid reference for a branch: {name}")
        start = (request.json() if request.body else {}).get("startingPoint") or "main"
        if start not in repo.branches:
            raise HubError(404, f"Invalid rev id: {start}", "RevisionNotFound")
        source = repo.branches[start]
        repo.branches[name] = Branch(dict(source.files), list(source.commits))
        return 200, {}

    def _preupload(self, branch: Branch, request: RecordedRequest):
        self._maybe_fail("preupload")
        files = [
            {
                "path": f["path"],
                "uploadMode": "regular",
                "shouldIgnore": False,
                # Like the Hub: the current oid lets the client skip unchanged files.
                "oid": git_blob_oid(branch.files[f["path"]]) if f["path"] in branch.files else None,
            }
            for f in request.json()["files"]
        ]
        return 200, {"files": files}

    def _commit(self, repo: Repo, branch: Branch, request: RecordedRequest):
        self._maybe_fail("commit")
        if (request.header("Content-Type") or "").split(";")[0] != "application/x-ndjson":
            raise HubError(400, "Expected an application/x-ndjson body")
        lines = [json.loads(line) for line in request.body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The first NDJSON line must be the commit header")
        header = lines[0]["value"]
        if header.get("parentCommit") and not branch.head.startswith(header["parentCommit"]):
            raise HubError(412, "A commit has happened since. Please refresh and try again.")
        files = dict(branch.files)
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"Unsupported encoding {value.get('encoding')!r}")
                files[value["path"]] = base64.b64decode(value["content"], validate=True)
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                files = {p: c for p, c in files.items() if not p.startswith(prefix)}
            else:
                raise HubError(400, f"HubDouble does not implement commit entries of kind {key!r} (LFS/Xet)")
        oid = hashlib.sha1(branch.head.encode() + request.body).hexdigest()
        branch.files = files
        branch.commits.append(Commit(oid, header["summary"], header.get("description", ""), branch.head))
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        commit_url = f"{self.url}/{prefix}{repo.repo_id}/commit/{oid}"
        return 200, {"success": True, "commitUrl": commit_url, "commitOid": oid, "pullRequestUrl": None}

    def _info(self, repo: Repo, rev: str):
        self._maybe_fail("info")
        branch = repo.branches.get(rev) or next((b for b in repo.branches.values() if b.head == rev), None)
        if branch is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        siblings = [{"rfilename": path} for path in sorted(branch.files)]
        return 200, {"id": repo.repo_id, "sha": branch.head, "private": repo.private, "siblings": siblings}


def _handler_for(hub: HubDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as huggingface_hub's client expects

        def _serve(self) -> None:
            request = RecordedRequest(self.command, self.path, tuple(self.headers.items()), self._read_body())
            with hub._lock:
                hub.requests.append(request)
                headers: dict[str, str] = {}
                try:
                    status, body = hub.handle(request)
                except HubError as err:
                    status, body = err.status, {"error": err.message}
                    headers = {"X-Error-Message": err.message}
                    if err.code:
                        headers["X-Error-Code"] = err.code
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

        def log_message(self, format: str, *args) -> None:
            pass  # requests are recorded; stderr stays clean for the tests that read it

    return Handler
