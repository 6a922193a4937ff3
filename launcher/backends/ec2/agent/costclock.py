"""The cost clock: what a job has cost so far, kept by its own nodes in its S3 folder, and the stop
before `--max-cost` would be passed. Nothing on the submitting machine needs to run.

Every instance of the job (each node of every attempt of a lineage, the group's replacements too)
writes its own part, `jobs/<job>/cost/<instance-id>.json` (../layout.py), when its agent starts
and then once a tick until it powers off:

    {"instance_id", "market": "spot" | "on-demand", "usd_per_hour", "started", "seen"}

`started` is when the instance booted (now minus the kernel's uptime: EC2 bills from the running
state, which the boot follows within seconds); `usd_per_hour` is the price job.json's `cost` block
gives the purchase option the instance runs on (IMDS `instance-life-cycle`), spot at the maximum
price the plan set, so the clock never counts less than AWS bills.

Each tick a node sums every part: an instance counts from `started` to now while it reports, and
to at most STALE_TICKS ticks past its last word once it stops reporting (it powered off, or its
agent died: the hard stop ends it then), and at least MIN_BILLED_S (EC2 bills Linux instances per
second with a one-minute minimum: Amazon EC2 pricing, "Per Second Billing"). When what was spent
plus what the job's nodes cost until the next tick and through a whole stop (the checkpoint, the
last sync, the power-off: `reserve_s`) would reach the cap, the node writes the job's stop marker
with reason `max-cost`, and for a lineage the newest attempt's too: every node saves a checkpoint
and ends, the lineage starts no further attempt, the job ends Stopped and `status` says why.

What the clock does not see: an instance whose agent never started (its user data failed first)
and the minutes a booting node runs before its first word (counted from its boot once it speaks).
The boot budget, the hard stop and the plan's worst case bound those (docs/reliability.md). An S3
outage leaves the clock unwritten and the job running: a service that is down does not end a
paid run; the hard stop still does, at max-run.

Stdlib and boto3 only, like the rest of the agent.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import layout
from .imds import Imds
from .job import BadObject, Job, NodeFailure, NodeIdentity, Settings, short
from .logs import LogSink
from .store import Store

REASON = "max-cost"  # the stop marker's reason (job.STOP_STATUS: the job ends Stopped)
TICK_S = 60.0  # how often each node writes its part and sums the job's
STALE_TICKS = 2  # an instance that stopped reporting counts this many ticks past its last word
MIN_BILLED_S = 60.0  # EC2's minimum per launch of a Linux instance
SHUTDOWN_S = 60.0  # from the agent's last word to the instance's end: the final records, the power-off
MAX_PARTS = 2000  # a job launches a few instances per attempt; more is a loop the cap must end


@dataclass(frozen=True)
class Prices:
    """job.json's `cost` block: the cap and what an hour of one node costs on each purchase option."""

    cap_usd: float
    usd_per_hour: dict[str, float]  # "on-demand", "spot" -> USD per instance-hour

    @classmethod
    def from_job(cls, job: Job) -> Prices | None:
        """None when the job has no cap; NodeFailure when the block is not what the launcher writes."""
        block = job.cost
        if not block:
            return None
        try:
            cap = float(block["max_usd"])
            prices = {str(k): float(v) for k, v in dict(block["usd_per_hour"]).items()}
        except (KeyError, TypeError, ValueError) as e:
            raise NodeFailure(f"job.json's cost is not what the launcher writes ({short(e)})") from None
        if not prices or not all(math.isfinite(x) and x > 0 for x in (cap, *prices.values())):
            raise NodeFailure(
                "job.json's cost has no positive finite cap and prices: the launcher and the bundle disagree"
            )
        return cls(cap, prices)

    def price(self, market: str | None) -> float:
        """The price of `market`; the highest one when the market is unknown."""
        return self.usd_per_hour.get(market or "", self.highest)

    @property
    def highest(self) -> float:
        return max(self.usd_per_hour.values())


@dataclass(frozen=True)
class Part:
    """One instance's part of the clock."""

    instance_id: str
    usd_per_hour: float
    started: float
    seen: float

    def billed_s(self, now: float, stale_s: float) -> float:
        """Seconds billed so far: to now while it reports, to at most `stale_s` past its last word."""
        end = min(now, self.seen + stale_s)
        return max(MIN_BILLED_S, end - self.started)

    def reporting(self, now: float, stale_s: float) -> bool:
        return now - self.seen <= stale_s

    def body(self, market: str) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "market": market,
            "usd_per_hour": self.usd_per_hour,
            "started": self.started,
            "seen": self.seen,
        }


def part_of(body: Any) -> Part | None:
    """A part read from S3 (anything may be there), or None when it is not one a node writes."""
    if not isinstance(body, dict):
        return None
    values = [body.get(k) for k in ("usd_per_hour", "started", "seen")]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        return None
    price, started, seen = (float(v) for v in values)  # type: ignore[arg-type]
    if price < 0 or started <= 0 or seen < started:
        return None
    return Part(str(body.get("instance_id", "?"))[:40], price, started, seen)


@dataclass(frozen=True)
class Spend:
    usd: float  # what every instance of the job has cost so far
    usd_per_hour: float  # what the instances that still report cost now
    instances: int  # every instance that has a part
    reporting: int


def spend(parts: list[Part], now: float, stale_s: float) -> Spend:
    usd = sum(p.usd_per_hour * p.billed_s(now, stale_s) / 3600 for p in parts)
    live = [p for p in parts if p.reporting(now, stale_s)]
    return Spend(usd, sum(p.usd_per_hour for p in live), len(parts), len(live))


class CostClock:
    """This instance's part of the job's clock, and the stop at the cap. `now` is the clock the
    tests control; `reserve_s` is how long a stop takes from the marker to the last power-off."""

    def __init__(
        self,
        job: Job,
        me: NodeIdentity,
        prices: Prices,
        store: Store,
        sink: LogSink,
        *,
        market: str | None,
        started: float,
        reserve_s: float,
        tick_s: float = TICK_S,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.job, self.me, self.prices, self.store, self.sink = job, me, prices, store, sink
        self.market = market if market in prices.usd_per_hour else "unknown"
        self.started, self.reserve_s, self.tick_s, self.now = started, reserve_s, tick_s, now
        self.stale_s = STALE_TICKS * tick_s
        self.key = layout.cost_record(job.prefix, job.job, me.instance_id)
        self.folder = layout.job_key(job.prefix, job.job, layout.COST) + "/"
        self.reached: str | None = None  # the stop's words, once the cap was reached
        self._parts: dict[str, tuple[str, Part | None]] = {}  # key -> (ETag, part): re-read only what changed
        self._ignored: set[str] = set()
        self.ticking: Any = None  # the thread `start` ticks it on

    def close(self) -> None:
        """Stop ticking: the node agent does when its work ends (the instance powers off next)."""
        if self.ticking is not None:
            self.ticking.stop()

    def tick(self) -> str | None:
        """Write this instance's part, sum the job's, and stop the job when the cap would be passed
        before the next tick and a stop; -> the stop's words once the cap was reached."""
        now = self.now()
        mine = Part(self.me.instance_id, self.prices.price(self.market), self.started, max(now, self.started))
        self.store.put_json(self.key, mine.body(self.market))
        others, left_out = self._read_parts()
        found = spend([mine, *others], now, self.stale_s)
        if left_out:  # each at least a minute at the highest price
            found = dataclasses.replace(found, usd=found.usd + left_out * self.prices.highest * MIN_BILLED_S / 3600)
        # The job keeps `nodes` instances (a lineage's group replaces the missing ones): the clock
        # reserves for all of them at the highest price, reporting or not.
        rate = max(found.usd_per_hour, self.job.nodes * self.prices.highest)
        ahead = rate * (self.tick_s + self.reserve_s) / 3600
        if self.reached is None and found.usd + ahead >= self.prices.cap_usd:
            self.reached = (
                f"max-cost reached: ${found.usd:.2f} spent by {found.instances} instance(s), and a stop takes "
                f"up to ${ahead:.2f} more; --max-cost ${self.prices.cap_usd:g} would be passed before the next "
                "check: every node saved a checkpoint and ended"
            )
            self.sink.agent(self.reached)
        if self.reached is not None:
            self.stop(self.reached)  # again each tick: an attempt that started meanwhile stops too
        return self.reached

    def _read_parts(self) -> tuple[list[Part], int]:
        """The other instances' parts, and how many were left unread (more than MAX_PARTS)."""
        listed = self.store.list(self.folder)
        left_out = max(0, len(listed) - MAX_PARTS)
        if left_out:  # the newest are read; the others count a minute each
            keys = sorted(listed, key=lambda k: listed[k]["LastModified"])[-MAX_PARTS:]
            listed = {k: listed[k] for k in keys}
        found: list[Part] = []
        for key, item in listed.items():
            etag = str(item.get("ETag"))
            if key == self.key:
                continue
            if key not in self._parts or self._parts[key][0] != etag:
                try:
                    part = part_of(self.store.get_json(key))
                except BadObject:
                    part = None
                self._parts[key] = (etag, part)
            part = self._parts[key][1]
            if part is None:
                if key not in self._ignored:
                    self._ignored.add(key)
                    self.sink.agent(f"ignored {self.store.uri(key)!r}: not a part of the cost clock")
                continue
            found.append(part)
        return found, left_out

    def stop(self, detail: str) -> None:
        """The job's stop marker (a lineage's: the whole lineage's and its newest attempt's); the
        first word on each stays."""
        marker = {"reason": REASON, "by": self.me.instance_id, "detail": detail, "time": self.now()}
        keys = [layout.job_key(self.job.prefix, self.job.job, layout.STOP)]
        if self.job.recovery:
            newest = self._newest_attempt()
            if newest is not None:
                keys.append(layout.job_key(self.job.prefix, self.job.job, layout.ATTEMPTS, str(newest), layout.STOP))
        for key in keys:
            self.store.put_json_once(key, marker)

    def _newest_attempt(self) -> int | None:
        folder = layout.job_key(self.job.prefix, self.job.job, layout.ATTEMPTS) + "/"
        pages = self.store.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.store.bucket, Prefix=folder, Delimiter="/"
        )
        numbers = [
            int(head)
            for page in pages
            for found in page.get("CommonPrefixes", [])
            if (head := found["Prefix"][len(folder) :].rstrip("/")).isdigit() and len(head) < 5
        ]
        return max(numbers) if numbers else None


def lineage_stop_words(marker: Any) -> str:
    """What a lineage's end says of its stop marker: the cap's words, else a cancel's."""
    if isinstance(marker, dict) and marker.get("reason") == REASON and isinstance(marker.get("detail"), str):
        from .job import one_line

        return one_line(marker["detail"])
    return "cancelled (distrain-cloud cancel)"


def reserve_s(settings: Settings) -> float:
    """From the stop marker to the last power-off: a poll to see it, the launcher's grace to save a
    checkpoint, the last sync to S3, the final records and the power-off."""
    return settings.poll_s + settings.stop_grace_s + settings.final_sync_s + SHUTDOWN_S


def boot_time(now: float | None = None) -> float:
    """When this instance booted (now minus the kernel's uptime), else now."""
    now = time.time() if now is None else now
    try:
        with open("/proc/uptime", encoding="ascii") as f:
            return now - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return now


def start(job: Job, me: NodeIdentity, settings: Settings, store: Store, imds: Imds, sink: LogSink) -> CostClock | None:
    """The node agent's hook: when job.json has a cap, this instance's clock, ticking on a thread
    until the instance powers off (the thread ends with the agent). Never raises: a clock that
    cannot start is said in the log; the hard stop still bounds the job."""
    try:
        prices = Prices.from_job(job)
        if prices is None:
            return None
        try:
            market = (imds.get("meta-data/instance-life-cycle") or "").strip() or None
        except Exception as e:  # counted at the highest price then
            sink.agent(f"purchase option not readable ({short(e)}): the cost clock counts the highest price")
            market = None
        started = boot_time()
        try:  # after a reboot the uptime starts again: the instance was billed since its first boot
            before = part_of(store.get_json(layout.cost_record(job.prefix, job.job, me.instance_id)))
        except BadObject:
            before = None
        if before is not None:
            started = min(started, before.started)
        reserve = reserve_s(settings)
        clock = CostClock(job, me, prices, store, sink, market=market, started=started, reserve_s=reserve)
    except Exception as e:
        sink.agent(f"the cost clock did not start ({short(e)}): --max-cost is not enforced on this node")
        return None
    from .job import Periodic

    try:
        clock.tick()
    except Exception as e:
        sink.agent(f"cost clock tick failed ({short(e)}); retrying")
    clock.ticking = Periodic(clock.tick_s, clock.tick, sink.agent, "cost clock tick")
    clock.ticking.start()
    sink.agent(
        f"cost clock: {clock.market} at ${clock.prices.price(clock.market):g}/h; the job stops before "
        f"--max-cost ${prices.cap_usd:g}"
    )
    return clock
