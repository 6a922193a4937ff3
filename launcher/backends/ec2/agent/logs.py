"""The node's log: a local file, and CloudWatch Logs in batches within its limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .job import EVENT_OVERHEAD, MAX_BATCH_BYTES, MAX_BATCH_EVENTS, MAX_MESSAGE_BYTES, short

# ----------------------------------------------------------------------------- logs


def log_batches(
    events: Sequence[dict[str, Any]], max_bytes: int = MAX_BATCH_BYTES, max_events: int = MAX_BATCH_EVENTS
) -> Iterator[list[dict[str, Any]]]:
    """PutLogEvents batches: in time order, each within the byte and event limits."""
    batch: list[dict[str, Any]] = []
    size = 0
    for event in sorted(events, key=lambda e: e["timestamp"]):  # stable: lines of one ms keep their order
        cost = len(event["message"].encode()) + EVENT_OVERHEAD
        if batch and (size + cost > max_bytes or len(batch) >= max_events):
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += cost
    if batch:
        yield batch


def log_event(line: str, when: float | None = None) -> dict[str, Any]:
    message = line.rstrip("\n") or " "  # CloudWatch refuses empty messages
    data = message.encode()
    if len(data) > MAX_MESSAGE_BYTES:
        message = data[: MAX_MESSAGE_BYTES - 32].decode(errors="ignore") + " [line truncated]"
    return {"timestamp": int((time.time() if when is None else when) * 1000), "message": message}


class LogSink:
    """Every line of this node (the agent's and the launcher's): a local file, the console, CloudWatch.

    CloudWatch gets them from a background thread every `flush_s`; if it refuses (no log group, no
    permission), the local file and its copy in S3 at the end still hold everything.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (open for the sink's life; close() ends it)
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self.logs: Any = None  # a CloudWatch Logs client, once to_cloudwatch() found the stream
        self.group = self.stream = ""
        self._warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self, line: str) -> None:
        line = line.rstrip("\n")
        with self._lock:
            self._file.write(line + "\n")
            if self.logs is not None:
                self._pending.append(log_event(line))
        print(line, flush=True)  # the console: EC2's console output and cloud-init's log

    def agent(self, message: str) -> None:
        self.write(f"node_agent: {message}")

    def to_cloudwatch(self, logs: Any, group: str, stream: str, flush_s: float) -> None:
        """Start shipping to `group`/`stream` (created here; the group comes from the stack)."""
        self.logs, self.group, self.stream = logs, group, stream
        try:
            logs.create_log_stream(logGroupName=group, logStreamName=stream)
        except logs.exceptions.ResourceAlreadyExistsException:
            pass
        except Exception as e:
            self._warn(f"CloudWatch log stream {group}/{stream} unavailable ({short(e)}); logs stay local")
            self.logs = None
            return
        with self._lock:  # what was written before the stream existed goes first
            self._pending = [log_event(line) for line in self.path.read_text().splitlines()]
        self._thread = threading.Thread(target=self._ship, args=(flush_s,), daemon=True)
        self._thread.start()

    def _ship(self, flush_s: float) -> None:
        while not self._stop.wait(flush_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        if not events or self.logs is None:
            return
        for batch in log_batches(events):
            try:
                self.logs.put_log_events(logGroupName=self.group, logStreamName=self.stream, logEvents=batch)
            except Exception as e:
                self._warn(f"CloudWatch refused {len(batch)} log lines ({short(e)}); they are in {self.path}")

    def _warn(self, message: str) -> None:
        if not self._warned:  # once: a broken log destination should not flood the log itself
            self._warned = True
            with self._lock:
                self._file.write(f"node_agent: {message}\n")
            print(f"node_agent: {message}", flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()
        self._file.close()
