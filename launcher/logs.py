"""A job's log as records, and the one printer of `distrain-cloud logs`.

Backends yield `LogLine`s (`Backend.log_lines`); `print_log_lines` writes them as text, as
the job printed them (cloud lines prefixed `[host] `), or with `--json` as JSON Lines: one
`{"time", "host", "message"}` object per line and nothing else on stdout.

Every byte of a log line, a node record or a failure reason was written by the job's code (or
whoever can write its S3 prefix), so text from there reaches a terminal only through
`printable`: escape sequences and other controls are shown, never obeyed. JSON output needs
no such care: `json.dumps` escapes every control character itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

# Characters a terminal would act on rather than show: C0 controls but tab (ESC starts OSC 0
# window titles, OSC 52 clipboard writes, CSI screen clears; CR overwrites what the line
# showed), DEL, C1 controls (0x9b is a one-byte CSI to some terminals), and the bidirectional
# overrides and isolates that make text read in another order than it runs. Each becomes its
# Python escape (`\x1b`, `\r`, `\u202e`), so the line still says what was there.
_SHOWN = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)] if c != 0x09}
_SHOWN |= {ord("\r"): "\\r", ord("\n"): "\\n"}
_SHOWN |= {c: f"\\u{c:04x}" for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def printable(text: str) -> str:
    """`text` safe to print to a person's terminal: every control but tab shown as its escape."""
    return text.translate(_SHOWN)


def one_line(value: object, limit: int = 300) -> str:
    """`value` (read from AWS or a node, so anything) as one printable line of at most `limit`
    characters, for a detail or a record that a person reads in one line."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The host of a local job's lines: this machine, one node. Its text lines go unprefixed.
LOCAL_HOST = "local"
# A local job's log line starts with the time it was written (training.node_launch.stamped).
_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) ")


def unstamp(line: str) -> tuple[str | None, str]:
    """(time, message) of a local job's log line; no time for a line written without one."""
    found = _STAMP.match(line)
    return (found.group(1), line[found.end() :]) if found else (None, line)


@dataclass(frozen=True)
class LogLine:
    time: str | None  # ISO 8601 UTC when the log says (CloudWatch and local logs do), else None
    host: str  # the node ("algo-2", "node-1", "local")
    message: str  # one line, without its line ending

    def text(self) -> str:
        return self.message if self.host == LOCAL_HOST else f"[{self.host}] {self.message}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def split_lines(text: str, host: str, time: str | None = None) -> Iterator[LogLine]:
    """`text` (a CloudWatch event, a line read from a file) as one LogLine per line: an event
    holding several lines gives each its own record, with the event's time."""
    parts = text.split("\n")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # the newline that ended the last line
    for part in parts:
        yield LogLine(time, host, part.removesuffix("\r"))


def iso_utc(epoch_ms: int) -> str:
    """CloudWatch's milliseconds since the epoch as `2024-11-26T05:20:00.123Z`."""
    when = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def print_log_lines(lines: Iterable[LogLine], *, as_json: bool = False) -> int:
    """Print each line as it comes (flushed: `--follow` output is read live); returns 0."""
    for line in lines:
        print(line.to_json() if as_json else printable(line.text()), flush=True)
    return 0
