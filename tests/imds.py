"""A fake EC2 instance metadata service (IMDSv2 only) on 127.0.0.1, one per simulated node.

moto's server has one fixed metadata identity and no spot notice, so each node of a rehearsal
gets one of these. Point a process at it with AWS_EC2_METADATA_SERVICE_ENDPOINT (and without
AWS_EC2_METADATA_DISABLED or access keys): botocore then fetches the role's credentials here,
exactly as on an instance, and the node agent reads its identity and the spot notice here.

    with FakeImds(instance_id="i-0abc", launch_index=1, reservation_id="r-1") as imds:
        env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.endpoint
        imds.set_spot_notice()          # meta-data/spot/instance-action now answers 200
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
ROLE = "distrain-node-test-role"


@dataclass
class Identity:
    instance_id: str = "i-0000000000000000a"
    launch_index: int = 0
    reservation_id: str = "r-0000000000000000a"
    local_ipv4: str = "127.0.0.1"
    region: str = "us-east-1"
    role: str = ROLE
    spot_action: dict[str, str] | None = None  # the instance-action document once a notice is set
    lifecycle: str = "spot"  # meta-data/instance-life-cycle: spot or on-demand
    # The role's session credentials (AccessKeyId, SecretAccessKey, SessionToken, Expiration), as
    # STS gave them for the instance profile's role; placeholders when a test needs no real ones.
    credentials: dict[str, Any] | None = None
    tokens: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)  # "GET /latest/meta-data/..." in arrival order

    def metadata(self) -> dict[str, str]:
        """path under /latest/ -> body, for everything but the spot notice."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 6 * 3600))
        given = self.credentials or {}
        creds = {
            "Code": "Success",
            "LastUpdated": now,
            "Type": "AWS-HMAC",
            # Obvious placeholders unless given: moto accepts any key.
            "AccessKeyId": given.get("AccessKeyId", "ASIAFAKEIMDSKEY00000"),
            "SecretAccessKey": given.get("SecretAccessKey", "fake-imds-secret-for-tests"),
            "Token": given.get("SessionToken", "fake-imds-session-token"),
            "Expiration": expires,
        }
        zone = self.region + "a"
        document = {"instanceId": self.instance_id, "region": self.region, "availabilityZone": zone}
        return {
            "meta-data/instance-id": self.instance_id,
            "meta-data/ami-launch-index": str(self.launch_index),
            "meta-data/reservation-id": self.reservation_id,
            "meta-data/local-ipv4": self.local_ipv4,
            "meta-data/placement/availability-zone": zone,
            "meta-data/placement/region": self.region,
            "meta-data/instance-life-cycle": self.lifecycle,
            "meta-data/iam/security-credentials/": self.role,
            f"meta-data/iam/security-credentials/{self.role}": json.dumps(creds),
            "dynamic/instance-identity/document": json.dumps(document),
        }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_PUT(self) -> None:
        ident = self.server.identity
        ident.requests.append(f"PUT {self.path}")
        if self.path != "/latest/api/token" or not self.headers.get(TOKEN_TTL_HEADER):
            self._answer(400, "token requests need a PUT to /latest/api/token with a TTL header")
            return
        token = secrets.token_hex(16)
        ident.tokens.add(token)
        self._answer(200, token)

    def do_GET(self) -> None:
        ident = self.server.identity
        ident.requests.append(f"GET {self.path}")
        if self.headers.get(TOKEN_HEADER) not in ident.tokens:  # IMDSv2 only, as the plan requires
            self._answer(401, "")
            return
        path = self.path.removeprefix("/latest/")
        if path == "meta-data/spot/instance-action":
            if ident.spot_action is None:
                self._answer(404, "")
            else:
                self._answer(200, json.dumps(ident.spot_action))
            return
        body = ident.metadata().get(path)
        self._answer(404, "") if body is None else self._answer(200, body)

    def _answer(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, identity: Identity) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.identity = identity


class FakeImds:
    """One node's metadata service; a context manager that serves on a thread."""

    def __init__(self, **identity: Any) -> None:
        self.identity = Identity(**identity)
        self._server = _Server(self.identity)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def start(self) -> FakeImds:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FakeImds:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_spot_notice(self, action: str = "terminate", in_seconds: int = 120) -> None:
        """What AWS publishes two minutes before it reclaims a spot instance."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + in_seconds))
        self.identity.spot_action = {"action": action, "time": when}
