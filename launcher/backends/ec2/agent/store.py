"""The job's S3 folder, read as hostile bytes: every read is bounded and checked."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .job import MAX_RECORD_BYTES, BadObject

# ----------------------------------------------------------------------------- S3


class Store:
    """The few S3 operations the agent needs, on one bucket.

    One client for the agent's life: the instance role's credentials come from IMDS and botocore
    refreshes them itself, and a poll every few seconds should not rebuild a client each time.
    """

    def __init__(self, bucket: str, region: str | None, s3: Any = None) -> None:
        from distrain_cloud.infra.aws import client

        self.bucket = bucket
        self.s3 = s3 if s3 is not None else client("s3", region)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put_json(self, key: str, value: Any) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(value).encode())

    def put_json_once(self, key: str, value: Any) -> bool:
        """Write `value` at `key` unless an object is there; False when one was (or is being) written.

        S3's conditional write (If-None-Match: *) makes "the first word stays" one atomic step: two
        nodes that stop at once cannot both read "no marker" and the later overwrite the earlier.
        """
        try:
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(value).encode(), IfNoneMatch="*")
        except self.s3.exceptions.ClientError as e:
            # 412: an object is there; 409: another conditional write of this key is in flight.
            if e.response.get("Error", {}).get("Code") in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
                "412",
                "409",
            ):
                return False
            raise
        return True

    def get_bytes(self, key: str, limit: int = MAX_RECORD_BYTES) -> bytes | None:
        """The first `limit` + 1 bytes at `key` (so that a caller can tell "too large"), or None when
        there is no such object."""
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        except self.s3.exceptions.NoSuchKey:
            return None
        try:
            return bytes(body.read(limit + 1))
        finally:
            body.close()

    def get_json(self, key: str) -> Any:
        """The JSON at `key`, or None when there is none; BadObject, naming it, for anything that is
        not JSON of at most MAX_RECORD_BYTES (every object the agent reads may have been planted)."""
        data = self.get_bytes(key)
        if data is None:
            return None
        if len(data) > MAX_RECORD_BYTES:
            raise BadObject(f"{self.uri(key)} is larger than {MAX_RECORD_BYTES} bytes")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise BadObject(f"{self.uri(key)} is not JSON ({type(e).__name__})") from None

    def list(self, prefix: str) -> dict[str, dict[str, Any]]:
        """key -> its listing entry (Size, LastModified, ETag), for every key under `prefix`."""
        found: dict[str, dict[str, Any]] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                found[item["Key"]] = item
        return found

    def upload(self, path: Path, key: str) -> None:
        self.s3.upload_file(str(path), self.bucket, key)

    def download(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.s3.download_file(self.bucket, key, str(path))

    def delete(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = [{"Key": k} for k in keys[start : start + 1000]]
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
