"""How the nodes meet through S3: no ec2:Describe* rights, no SSH, no dependence on boot order."""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable
from typing import Any

from .. import layout
from .job import BadObject, Job, NodeFailure, NodeIdentity, is_int
from .store import Store

# ----------------------------------------------------------------------------- rendezvous


def rendezvous(
    store: Store,
    job: Job,
    me: NodeIdentity,
    *,
    poll_s: float,
    progress: Callable[[int], None] = lambda joined: None,
    stop_check: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda message: None,
) -> list[dict[str, Any]]:
    """Meet the other nodes of this launch; -> their records, ordered by rank (= launch index).

    One RunInstances call gives every node the same reservation id and launch indices 0..N-1, so
    the folder and the ranks need no coordination and no ec2:Describe* rights; a relaunch gets a
    new reservation id, so records of an earlier launch are never read. `stop_check` raises to
    give up early (a cancel, a peer that failed to boot). Only `<i>.json` for i in 0..N-1 with a
    valid body counts; anything else in the folder is named once through `log` and ignored.
    """
    folder = job.key(layout.RENDEZVOUS, me.reservation_id) + "/"
    mine = {"ip": me.ip, "instance_id": me.instance_id, "launch_index": me.launch_index, "time": time.time()}
    store.put_json(f"{folder}{me.launch_index}.json", mine)
    start = clock()
    judged: dict[str, str] = {}  # key -> the ETag read: a body is read (and an odd one named) once
    found: dict[int, dict[str, Any]] = {}
    while True:
        for key, item in store.list(folder).items():
            if judged.get(key) == item.get("ETag"):
                continue
            judged[key] = str(item.get("ETag"))
            index = rank_of(key[len(folder) :], job.nodes)
            entry, why = None, f"not a record of node 0..{job.nodes - 1}"
            if index is not None:
                found.pop(index, None)  # what it says now is what counts
                try:
                    entry, why = _rendezvous_entry(store.get_json(key), index), f"not a valid entry of node {index}"
                except BadObject as e:
                    why = str(e).removeprefix(store.uri(key) + " ")
            if entry is None or index is None:
                log(f"ignored {key!r} in the rendezvous folder: {why}")
            else:
                found[index] = entry
        joined = sorted(found)
        progress(len(joined))
        if len(joined) >= job.nodes:
            return [found[i] for i in range(job.nodes)]
        stop_check()
        if clock() - start >= job.rendezvous_timeout_s:
            missing = [i for i in range(job.nodes) if i not in joined]
            which = ", ".join(map(str, missing))
            raise NodeFailure(
                f"node{'s' if len(missing) > 1 else ''} {which} of {job.nodes} never joined the rendezvous "
                f"within {job.rendezvous_timeout_s} s (ranks count from 0; see that instance's console output)"
            )
        sleep(poll_s)


_RECORD_NAME = re.compile(r"(0|[1-9][0-9]{0,8})\.json")


def rank_of(name: str, nodes: int) -> int | None:
    """The rank a record's file name (`<rank>.json`, no leading zeros) gives, if it is one of 0..nodes-1."""
    m = _RECORD_NAME.fullmatch(name)
    return int(m.group(1)) if m and int(m.group(1)) < nodes else None


def _rendezvous_entry(body: Any, index: int) -> dict[str, Any] | None:
    """The entry node `index` wrote (its address, instance id, launch index), or None when `body` is
    not one: the address becomes the main node's address of every launcher, so it must be an IP."""
    if not isinstance(body, dict) or not is_int(body.get("launch_index")) or body["launch_index"] != index:
        return None
    ip, instance_id = body.get("ip"), body.get("instance_id")
    if not isinstance(ip, str) or not isinstance(instance_id, str):
        return None
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return None
    return {"ip": ip, "instance_id": instance_id, "launch_index": index}
