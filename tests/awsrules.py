"""What AWS's control plane does that moto does not, played on top of moto for the tests.

moto is kinder than AWS exactly where money is at stake: it replaces an Auto Scaling group's
terminated instance at once (even with Launch suspended), never replaces one that stops, never
runs a scheduled action, never rebalances zones and never reclaims a spot instance. `AwsRules`
keeps a clock of its own (advanced by the test: nothing sleeps) and, at each `tick`, applies the
rules below to moto's backends, each as the AWS document cited in its method's docstring says:

    with mock_aws(), AwsRules("us-east-1") as aws:
        ...create the group through boto3, as the launcher does...
        aws.tick(aws.now + 60)           # replacements, scheduled actions, spot terminations
        aws.imds(instance_id)            # that instance's metadata service (tests/imds.py)
        aws.reclaim(instance_id)         # its 2-minute notice now, its end two minutes on
        aws.billed_seconds("job-name")   # launch to termination, by the distrain-cloud:job tag

Played (docs/reliability.md lists them with the same citations):
- replacement of instances that stop or terminate while desired capacity is unmet (`_health_checks`,
  `_replace`): EC2 Auto Scaling User Guide, "Health checks for instances in an Auto Scaling group";
- scheduled actions fire at their StartTime (`_scheduled_actions`): EC2 Auto Scaling User Guide,
  "Scheduled scaling";
- AZRebalance launches before it terminates, without a spot notice, unless suspended
  (`rebalance`): EC2 Auto Scaling User Guide, "Suspend and resume processes" ("Rebalancing activities");
- a reclaimed spot instance gets its interruption notice two minutes before it terminates
  (`reclaim`): EC2 User Guide, "Spot Instance interruption notices";
- TerminateInstanceInAutoScalingGroup refuses (ValidationError) an instance in no group and a
  decrement below MinSize: EC2 Auto Scaling API Reference, "TerminateInstanceInAutoScalingGroup".
Not played: health-check grace periods and the delay before a replacement (a replacement comes
at the next tick), warm pools, lifecycle hooks, capacity shortages (`InsufficientInstanceCapacity`).

Billing: an instance counts from the moment moto creates it to the moment it terminates, both
on this clock (EC2 bills per second from launch; the simulator counts pending and shutting-down
too, which over- rather than under-states a job's cost). DescribeInstances answers on this clock
too: LaunchTime, and a terminated instance's StateTransitionReason "User initiated (<time> GMT)".
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from imds import FakeImds

JOB_TAG = "distrain-cloud:job"
SPOT_NOTICE_S = 120  # "two minutes before Amazon EC2 stops or terminates your Spot Instance"
SPOT_TERMINATION = "Server.SpotInstanceTermination"
LIVE = ("pending", "running")


@dataclass
class _Action:
    group: str
    name: str
    start: float
    min_size: int | None
    max_size: int | None
    desired: int | None


class AwsRules:
    """AWS's rules over moto's in-process backends for one region (use inside `moto.mock_aws()`)."""

    def __init__(self, region: str = "us-east-1", *, now: float | None = None, account: str | None = None) -> None:
        from moto.core import DEFAULT_ACCOUNT_ID

        self.region = region
        self.account = account or DEFAULT_ACCOUNT_ID
        self.now = time.time() if now is None else float(now)
        self.events: list[str] = []  # what the rules did, one line each: "<t> <what>"
        self.launched: dict[str, float] = {}  # instance id -> launch time on this clock
        self.ended: dict[str, float] = {}  # instance id -> termination time on this clock
        self._notices: dict[str, float] = {}  # instance id -> when the reclaim terminates it
        self._actions: dict[tuple[str, str], _Action] = {}
        self._imds: dict[str, FakeImds] = {}
        self._patches = contextlib.ExitStack()

    # -- the simulator's life

    def __enter__(self) -> AwsRules:
        from unittest import mock

        from moto.autoscaling.models import AutoScalingBackend
        from moto.ec2.models.instances import Instance

        rules = self
        made, ended = Instance.__init__, Instance.terminate

        def init(instance: Any, *args: Any, **kwargs: Any) -> None:
            made(instance, *args, **kwargs)
            rules.launched.setdefault(instance.id, rules.now)
            instance.launch_time = dt.datetime.fromtimestamp(rules.now, dt.timezone.utc).replace(tzinfo=None)

        def terminate(instance: Any) -> Any:
            rules.ended.setdefault(instance.id, rules.now)
            previous = ended(instance)
            # What EC2 says of a terminated instance, on this clock: "User initiated (<UTC> GMT)".
            instance._reason = f"User initiated ({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(rules.now))} GMT)"
            return previous

        def notified(backend: Any, instance_ids: list[str]) -> None:
            # AWS takes a terminated instance out of its group; the replacement is the health
            # check's, at the next tick, and never while Launch is suspended (moto's comes at once).
            for group in backend.autoscaling_groups.values():
                group.instance_states = [s for s in group.instance_states if s.instance.id not in instance_ids]

        put = AutoScalingBackend.put_scheduled_update_group_action
        leave = AutoScalingBackend.terminate_instance

        def terminate_in_group(backend: Any, instance_id: str, should_decrement: bool) -> Any:
            # EC2 Auto Scaling API Reference, TerminateInstanceInAutoScalingGroup: a ValidationError
            # for an instance in no group (moto raises StopIteration, an internal error) and for a
            # decrement below the group's minimum size.
            from moto.autoscaling.exceptions import ValidationError

            group = next(
                (
                    g
                    for g in backend.autoscaling_groups.values()
                    if instance_id in {s.instance.id for s in g.instance_states}
                ),
                None,
            )
            if group is None:
                raise ValidationError(
                    f"Instance Id not found - No managed instance found for instance ID: {instance_id}"
                )
            if should_decrement and int(group.desired_capacity or 0) - 1 < int(group.min_size or 0):
                raise ValidationError(
                    f"Currently, desiredSize equals minSize ({group.min_size}). Terminating instance without "
                    "replacement will violate group's min size constraint. Either set shouldDecrementDesiredCapacity "
                    "flag to false or lower group's min size."
                )
            return leave(backend, instance_id, should_decrement)

        def scheduled(backend: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            # moto keys scheduled actions by their name alone, so two groups' "lineage-hard-stop"
            # overwrite each other there; AWS keys them by group and name.
            found = put(backend, name, *args, **kwargs)
            if backend.region_name == rules.region:
                rules._actions[(name, found.scheduled_action_name)] = _Action(
                    group=name,
                    name=found.scheduled_action_name,
                    start=_epoch(found.start_time) if found.start_time else rules.now,
                    min_size=found.min_size,
                    max_size=found.max_size,
                    desired=found.desired_capacity,
                )
            return found

        for target, name, new in (
            (Instance, "__init__", init),
            (Instance, "terminate", terminate),
            (AutoScalingBackend, "notify_terminate_instances", notified),
            (AutoScalingBackend, "put_scheduled_update_group_action", scheduled),
            (AutoScalingBackend, "terminate_instance", terminate_in_group),
        ):
            self._patches.enter_context(mock.patch.object(target, name, new))
        return self

    def __exit__(self, *exc: object) -> None:
        self._patches.close()
        for fake in self._imds.values():
            fake.stop()
        self._imds.clear()

    # -- moto's backends

    @property
    def _asg(self) -> Any:
        from moto.autoscaling.models import autoscaling_backends

        return autoscaling_backends[self.account][self.region]

    @property
    def _ec2(self) -> Any:
        from moto.ec2.models import ec2_backends

        return ec2_backends[self.account][self.region]

    def _instance(self, instance_id: str) -> Any:
        return self._ec2.get_instance(instance_id)

    def _log(self, what: str) -> None:
        self.events.append(f"{self.now:.0f} {what}")

    # -- the clock

    def tick(self, now: float | None = None) -> list[str]:
        """Move the clock to `now` (never back) and apply every rule due by then; -> what happened."""
        before = len(self.events)
        self.now = max(self.now, self.now if now is None else float(now))
        self._spot_terminations()
        self._scheduled_actions()
        self._health_checks()
        self._replace()
        return self.events[before:]

    def advance(self, seconds: float) -> list[str]:
        return self.tick(self.now + seconds)

    def run_until(self, done: Callable[[], bool], *, step_s: float, limit_s: float) -> bool:
        """Tick by `step_s` until `done()` or `limit_s` on this clock; -> whether `done()` came."""
        end = self.now + limit_s
        while not done():
            if self.now >= end:
                return False
            self.advance(step_s)
        return True

    # -- the rules

    def _scheduled_actions(self) -> None:
        """EC2 Auto Scaling User Guide, "Scheduled scaling": a scheduled action sets the group's
        minimum, maximum and desired capacity at its StartTime (UTC); a one-time action is then gone.
        Not while the group's ScheduledActions process is suspended ("Suspend and resume processes")."""
        groups = self._asg.autoscaling_groups
        for key, action in sorted(self._actions.items(), key=lambda kv: kv[1].start):
            group = groups.get(action.group)
            if group is None:  # deleting a group deletes its scheduled actions
                del self._actions[key]
                continue
            if action.start > self.now or "ScheduledActions" in _suspended(group):
                continue
            del self._actions[key]
            if action.min_size is not None:
                group.min_size = action.min_size
            if action.max_size is not None:
                group.max_size = action.max_size
            if action.desired is not None:
                self._log(f"scheduled action {action.name} of {action.group}: desired {action.desired}")
                group.desired_capacity = action.desired
                self._scale_in(group)

    def _scale_in(self, group: Any) -> None:
        """Desired capacity below the instances in service: the group terminates the difference
        (no spot notice; the default termination policy's oldest-first is played as moto's order)."""
        extra = len(_in_service(group)) - int(group.desired_capacity or 0)
        if extra <= 0 or "Terminate" in _suspended(group):
            return
        gone = [s for s in group.instance_states if s.instance.state in LIVE][:extra]
        for state in gone:
            self._log(f"{group.name} scales in: terminates {state.instance.id}")
            self._ec2.terminate_instances([state.instance.id])
        group.instance_states = [s for s in group.instance_states if s not in gone]

    def _health_checks(self) -> None:
        """EC2 Auto Scaling User Guide, "Health checks for instances in an Auto Scaling group": an
        instance whose EC2 state is anything but running (stopped, stopping, shutting-down,
        terminated) is unhealthy; the group terminates it and takes it out of service."""
        for group in list(self._asg.autoscaling_groups.values()):
            for state in list(group.instance_states):
                instance = state.instance
                if instance.state in LIVE:
                    continue
                if instance.state in ("stopping", "stopped"):
                    self._ec2.terminate_instances([instance.id])
                self._log(f"{group.name}: {instance.id} is unhealthy ({instance.state}): out of service")
                group.instance_states.remove(state)

    def _replace(self) -> None:
        """EC2 Auto Scaling User Guide, "Health checks for instances in an Auto Scaling group": the
        group launches replacements while its desired capacity exceeds the instances in service
        (never more than MaxSize), unless its Launch process is suspended."""
        for group in list(self._asg.autoscaling_groups.values()):
            missing = min(int(group.desired_capacity or 0), int(group.max_size or 0)) - len(_in_service(group))
            if missing <= 0 or "Launch" in _suspended(group):
                continue
            before = {s.instance.id for s in group.instance_states}
            group.replace_autoscaling_group_instances(missing, group.get_propagated_tags())
            new = [s.instance.id for s in group.instance_states if s.instance.id not in before]
            self._log(f"{group.name} launches {', '.join(new)} (desired {group.desired_capacity})")

    def _spot_terminations(self) -> None:
        for instance_id, at in sorted(self._notices.items(), key=lambda kv: kv[1]):
            if at > self.now:
                continue
            del self._notices[instance_id]
            instance = self._instance(instance_id)
            if instance.state in LIVE:
                self._ec2.terminate_instances([instance_id])
                instance.state_reason.code = SPOT_TERMINATION
                instance.state_reason.message = "Server.SpotInstanceTermination: Spot instance termination"
                self._log(f"spot reclaims {instance_id}")

    def reclaim(self, *instance_ids: str) -> None:
        """EC2 User Guide, "Spot Instance interruption notices": two minutes before it reclaims a
        spot instance, EC2 answers meta-data/spot/instance-action with the action and its time (404
        until then); the instance terminates at that time (a tick at or after it)."""
        for instance_id in instance_ids:
            at = self.now + SPOT_NOTICE_S
            self._notices[instance_id] = at
            self.imds(instance_id).identity.spot_action = {"action": "terminate", "time": _iso(at)}
            self._log(f"spot notice for {instance_id} (terminates at {at:.0f})")

    def rebalance(self, group_name: str) -> list[str]:
        """EC2 Auto Scaling User Guide, "Suspend and resume processes", "Rebalancing activities":
        AZRebalance launches an instance in the zone with the fewest before it terminates one in the
        zone with the most (it may exceed MaxSize by 10 %, at least one instance, meanwhile); the
        terminated instance gets no spot notice. Nothing when AZRebalance is suspended.
        -> [launched, terminated] instance ids, or [] when it did nothing."""
        group = self._asg.autoscaling_groups[group_name]
        if "AZRebalance" in _suspended(group) or not _in_service(group):
            return []
        old = _in_service(group)[0].instance.id
        before = {s.instance.id for s in group.instance_states}
        group.replace_autoscaling_group_instances(1, group.get_propagated_tags())
        (new,) = [s.instance.id for s in group.instance_states if s.instance.id not in before]
        self._ec2.terminate_instances([old])
        group.instance_states = [s for s in group.instance_states if s.instance.id != old]
        self._log(f"{group_name} rebalances zones: launches {new}, terminates {old}")
        return [new, old]

    def power_off(self, instance_id: str, behaviour: str = "terminate") -> None:
        """An instance-initiated shutdown (`shutdown -h now` on the node): with the
        InstanceInitiatedShutdownBehavior the plan sets (terminate) the instance terminates; with
        stop it stops, and the next tick's health check ends and replaces it."""
        if behaviour == "terminate":
            self._ec2.terminate_instances([instance_id])
        else:
            self._ec2.stop_instances([instance_id])
        self._log(f"{instance_id} powers itself off ({behaviour})")

    # -- looking

    def imds(self, instance_id: str) -> FakeImds:
        """The metadata service of `instance_id` (started on first use; stopped on exit)."""
        if instance_id not in self._imds:
            instance = self._instance(instance_id)
            self._imds[instance_id] = FakeImds(
                instance_id=instance_id,
                launch_index=int(getattr(instance, "ami_launch_index", 0) or 0),
                reservation_id=getattr(instance, "reservation_id", None) or "r-0000000000000000a",
                region=self.region,
                lifecycle="spot" if getattr(instance, "lifecycle", None) == "spot" else "on-demand",
            ).start()
        return self._imds[instance_id]

    def group_instances(self, group_name: str) -> list[str]:
        """The instances the group counts (in service), oldest first."""
        group = self._asg.autoscaling_groups.get(group_name)
        return [s.instance.id for s in _in_service(group)] if group is not None else []

    def tagged(self, job: str | None = None, *, key: str = JOB_TAG) -> list[str]:
        """Every instance ever launched with tag `key` (= `job`, or any value), terminated ones too."""
        out = []
        for instance in self._ec2.all_instances():
            tags = {t.get("key", t.get("Key")): t.get("value", t.get("Value")) for t in instance.get_tags()}
            if key in tags and (job is None or tags[key] == job):
                out.append(instance.id)
        return out

    def live(self, job: str | None = None) -> list[str]:
        return [i for i in self.tagged(job) if self._instance(i).state in LIVE]

    def billed_seconds(self, job: str | None = None, *, key: str = JOB_TAG) -> float:
        """Instance-seconds of every instance tagged `key` = `job` (any value when None), each from
        its launch to its termination (or to now while it runs), on this clock."""
        return sum(self.seconds_of(i) for i in self.tagged(job, key=key))

    def seconds_of(self, instance_id: str) -> float:
        start = self.launched.get(instance_id, self.now)
        return max(0.0, self.ended.get(instance_id, self.now) - start)


def _suspended(group: Any) -> set[str]:
    return {p["ProcessName"] for p in group.suspended_processes}


def _in_service(group: Any) -> list[Any]:
    return [s for s in group.instance_states if s.instance.state in LIVE and s.lifecycle_state != "Standby"]


def _epoch(value: Any) -> float:
    if isinstance(value, dt.datetime):
        when = value
    else:
        when = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@contextlib.contextmanager
def rules(region: str = "us-east-1", **kwargs: Any) -> Iterator[AwsRules]:
    """`with rules(REGION) as aws:` inside moto's mock."""
    with AwsRules(region, **kwargs) as found:
        yield found
