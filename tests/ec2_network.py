"""What EC2 does with a job's network that moto does not, played on top of moto: placement groups
(moto: CreatePlacementGroup is "not implemented", RunInstances drops Placement.GroupName without a
word) and security groups still in use (moto deletes a group its instances use).

What AWS does that this plays, and where AWS says so:
- CreatePlacementGroup makes a group; a second one of the same name is refused with
  InvalidPlacementGroup.Duplicate (EC2 API Reference, CreatePlacementGroup; "Error codes for the
  Amazon EC2 API").
- RunInstances, and an Auto Scaling group's CreateAutoScalingGroup, naming a group that does not
  exist are refused: InvalidPlacementGroup.Unknown (EC2), a ValidationError (EC2 Auto Scaling).
- A cluster placement group cannot span zones (EC2 User Guide, "Placement strategies", cluster:
  "instances within a single Availability Zone"): a launch into another zone than the group's
  live instances is refused.
- DescribePlacementGroups answers the region's groups, narrowed by GroupNames and by the filters
  group-name, state, strategy, tag:<key> and tag-key (EC2 API Reference, DescribePlacementGroups).
  A deleted group stays in its answers for a while in the state `deleted` (the state filter's
  values there: pending | available | deleting | deleted), so a caller that lists what is left
  must filter on the state; played by keeping every deleted group listed, as `deleted`, for the
  rest of the test. Its name may be taken again at once.
- DeletePlacementGroup is refused while an instance in the group is not terminated, or an Auto
  Scaling group still launches into it: InvalidPlacementGroup.InUse ("Delete a placement group":
  "you must terminate ... the instances in the placement group").
- DeleteSecurityGroup is refused with DependencyViolation while a network interface (so an
  instance that is not terminated) is in the group (EC2 User Guide, "Delete a security group":
  "You can't delete a security group that is associated with an instance").

The played groups live in `GROUPS` (reset per test by `play`); the instances launched into each
are found by id in moto's own backend.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

GROUPS: dict[tuple[str, str, str], Group] = {}  # (account, region, name) -> the group
DELETED: list[tuple[str, str, Group]] = []  # (account, region, group): still listed, as `deleted`
_IDS = itertools.count(1)


@dataclasses.dataclass
class Group:
    name: str
    strategy: str
    tags: list[dict[str, str]]
    group_id: str
    instances: set[str] = dataclasses.field(default_factory=set)
    state: str = "available"


def play(monkeypatch) -> dict[tuple[str, str, str], Group]:
    """Give moto's EC2 (and EC2 Auto Scaling) these rules, for as long as `monkeypatch` holds."""
    from moto.autoscaling.exceptions import ValidationError
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses import EC2Response

    GROUPS.clear()
    DELETED.clear()

    def key(response: Any, name: str) -> tuple[str, str, str]:
        return (response.current_account, response.region, name)

    def shown(group: Group) -> dict[str, Any]:
        return {
            "GroupName": group.name,
            "GroupId": group.group_id,
            "Strategy": group.strategy,
            "State": group.state,
            "Tags": group.tags,
        }

    def create_placement_group(self: Any) -> ActionResult:
        name = self._get_param("GroupName")
        if key(self, name) in GROUPS:
            raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
        tags = self._parse_tag_specification("placement-group").get("placement-group", {})
        group = Group(
            name=name,
            strategy=self._get_param("Strategy"),
            tags=[{"Key": k, "Value": v} for k, v in tags.items()],
            group_id=f"pg-{next(_IDS):017x}",
        )
        GROUPS[key(self, name)] = group
        return ActionResult({"PlacementGroup": shown(group)})

    def matches(group: Group, filters: dict[str, list[str]]) -> bool:
        tags = {t["Key"]: t["Value"] for t in group.tags}
        for name, values in filters.items():
            if name == "group-name":
                seen = [group.name]
            elif name == "strategy":
                seen = [group.strategy]
            elif name == "state":
                seen = [group.state]
            elif name == "tag-key":
                seen = list(tags)
            elif name.startswith("tag:"):
                seen = [tags[name[4:]]] if name[4:] in tags else []
            else:
                raise EC2ClientError("InvalidParameterValue", f"The filter '{name}' is invalid")
            if not set(seen) & set(values):
                return False
        return True

    def describe_placement_groups(self: Any) -> ActionResult:
        names = self._get_param("GroupNames", [])
        filters = self._filters_from_querystring()
        listed = [(a, r, g) for (a, r, _), g in GROUPS.items()] + DELETED
        found = [
            g
            for a, r, g in listed
            if (a, r) == key(self, "")[:2] and (not names or g.name in names) and matches(g, filters)
        ]
        return ActionResult({"PlacementGroups": [shown(g) for g in found]})

    def delete_placement_group(self: Any) -> ActionResult:
        name = self._get_param("GroupName")
        group = GROUPS.get(key(self, name))
        if group is None:
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        if _live(self, group) or _groups_launching(self, name):
            raise EC2ClientError("InvalidPlacementGroup.InUse", f"The Placement Group '{name}' is in use.")
        del GROUPS[key(self, name)]
        group.state = "deleted"
        DELETED.append((self.current_account, self.region, group))
        return ActionResult({})

    real_run = EC2Response.run_instances

    def run_instances(self: Any) -> Any:
        name = self._get_param("Placement.GroupName")
        if not name:
            return real_run(self)
        group = GROUPS.get(key(self, name))
        if group is None:
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        zones = {i.placement.zone for i in _live(self, group)}
        before = {i.id for i in self.ec2_backend.all_instances()}
        answer = real_run(self)
        new = [i for i in self.ec2_backend.all_instances() if i.id not in before]
        if zones and {i.placement.zone for i in new} - zones:
            for i in new:  # AWS refuses the whole launch: nothing of it stays
                self.ec2_backend.terminate_instances([i.id])
            raise EC2ClientError(
                "InvalidParameterCombination", f"The Placement Group '{name}' is in {', '.join(sorted(zones))}."
            )
        group.instances |= {i.id for i in new}
        return answer

    real_delete_group = EC2Response.delete_security_group

    def delete_security_group(self: Any) -> Any:
        group = self._get_param("GroupId")
        for instance in self.ec2_backend.all_instances():
            held = {g.id for nic in instance.nics.values() for g in nic.group_set}
            if instance.state != "terminated" and group in held:
                raise EC2ClientError("DependencyViolation", f"resource {group} has a dependent object ({instance.id})")
        return real_delete_group(self)

    real_create = AutoScalingResponse.create_auto_scaling_group

    def create_auto_scaling_group(self: Any) -> Any:
        name = self._get_param("PlacementGroup")
        if name and (self.current_account, self.region, name) not in GROUPS:
            raise ValidationError(f"Placement group '{name}' does not exist.")
        return real_create(self)

    played = (create_placement_group, describe_placement_groups, delete_placement_group, run_instances)
    for method in (*played, delete_security_group):
        monkeypatch.setattr(EC2Response, method.__name__, method, raising=False)
    monkeypatch.setattr(AutoScalingResponse, "create_auto_scaling_group", create_auto_scaling_group)
    return GROUPS


def _live(response: Any, group: Group) -> list[Any]:
    live = []
    for instance in response.ec2_backend.all_instances():
        if instance.id in group.instances and instance.state != "terminated":
            live.append(instance)
    return live


def _groups_launching(response: Any, name: str) -> bool:
    """Whether an Auto Scaling group of the region still launches into placement group `name`."""
    from moto.autoscaling.models import autoscaling_backends

    backend = autoscaling_backends[response.current_account][response.region]
    return any(g.placement_group == name for g in backend.autoscaling_groups.values())
