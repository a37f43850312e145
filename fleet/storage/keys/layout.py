"""The two key layouts: the plain one (a single Redis), and the cluster one.

In the cluster layout (`use_cluster_layout`, FLEET_REDIS_CLUSTER=1) a tree's keys carry its
root as the hash tag (`fleet:trace:{ROOT}@explore-001-...`), the limiter's `{limits}` and the
provider batches' `{batch}`. How a key is named, below the keys themselves: every key
module names its keys through this one.
"""

from __future__ import annotations

from fleet.ids import check_trace_id, root_of

PREFIX = "fleet"

LAYOUT = {"cluster": False}
"""Which layout this process names keys in; set once at start-up (`use_cluster_layout`)."""


def use_cluster_layout(on: bool) -> None:
    """Name every key of a tree with its root as the hash tag (FLEET_REDIS_CLUSTER=1).

    Redis Cluster keeps the keys of one tag in one slot, so a script over a tree's keys runs
    on one node. Set once per process, before any key is named (`redis_connect.connect`);
    a fleet's processes must all agree (a cluster store is never read in the plain layout).
    """
    LAYOUT["cluster"] = on


def cluster_layout() -> bool:
    """Whether keys are named in the cluster layout."""
    return LAYOUT["cluster"]


def tree_id(trace_id: str) -> str:
    """The id in a tree's key: as it is, or (cluster layout) its root part as the hash tag.

    `{root}@explore-001-...`: a child's id starts with its root's, so every key of a tree
    lands in the root's slot, whatever its depth.
    """
    check_trace_id(trace_id)
    if not LAYOUT["cluster"]:
        return trace_id
    root = root_of(trace_id)
    return f"{{{root}}}{trace_id[len(root) :]}"
