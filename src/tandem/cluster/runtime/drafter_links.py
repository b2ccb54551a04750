"""How replicas learn the drafters: the router hands every live replica a link to every live
drafter worker (its endpoint, cost curve and incarnation, and the round trip between the two
groups), at start and again whenever a drafter or replica dies or comes back. A replica keeps
a drafter it already links to while its incarnation is the same (its sequences' caches are
there) and forgets one that restarted (cluster/runtime/remote_draft.py)."""

from typing import Callable

from tandem.cluster.runtime.pool import Worker
from tandem.cluster.runtime.replica import DrafterLink


def push_drafters(replicas: list[Worker], drafters: list[Worker], rtt_between: Callable[[str, str], float],
                  draft_ahead: bool = False) -> None:
    for replica in replicas:
        if replica.alive:
            links = [DrafterLink(d.name, d.endpoint, d.cost.cost.to_wire(), d.restarts, rtt_between(replica.group, d.group))
                     for d in drafters if d.alive]
            replica.endpoint.call("set_drafters", links, draft_ahead)
