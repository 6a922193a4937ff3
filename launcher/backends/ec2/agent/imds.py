"""IMDSv2: who this node is, and whether a spot notice has come."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .job import IMDS_DEFAULT, NodeFailure, NodeIdentity

# ----------------------------------------------------------------------------- IMDSv2


class Imds:
    """The instance metadata service, IMDSv2 only (the plan requires tokens)."""

    def __init__(self, endpoint: str = IMDS_DEFAULT, timeout_s: float = 2.0) -> None:
        self.base = endpoint.rstrip("/") + "/latest/"
        self.timeout_s = timeout_s
        self._token: str | None = None

    def _request(self, method: str, path: str, headers: dict[str, str]) -> urllib.request.Request:
        return urllib.request.Request(self.base + path, method=method, headers=headers)

    def token(self) -> str:
        if self._token is None:
            req = self._request("PUT", "api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                self._token = r.read().decode()
        return self._token

    def get(self, path: str) -> str | None:
        """The text at latest/<path>, or None where it does not exist (404)."""
        for attempt in range(2):
            req = self._request("GET", path, {"X-aws-ec2-metadata-token": self.token()})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    return str(r.read().decode())
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and attempt == 0:  # the token expired: take a new one once
                    self._token = None
                    continue
                raise
        return None

    def identity(self) -> NodeIdentity:
        def need(path: str) -> str:
            value = self.get(f"meta-data/{path}")
            if not value:
                raise NodeFailure(f"the instance metadata has no {path}")
            return value.strip()

        return NodeIdentity(
            instance_id=need("instance-id"),
            launch_index=int(need("ami-launch-index")),
            reservation_id=need("reservation-id"),
            ip=need("local-ipv4"),
            region=(self.get("meta-data/placement/region") or "").strip() or None,
        )

    def spot_notice(self) -> dict[str, Any] | None:
        """The spot instance-action document once AWS has set one (404 until then)."""
        text = self.get("meta-data/spot/instance-action")
        if not text:
            return None
        try:
            return dict(json.loads(text))
        except ValueError:
            return {"action": text.strip()}
