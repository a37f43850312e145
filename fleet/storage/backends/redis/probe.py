"""Whether a Redis URL names a node of a Redis Cluster, asked of the server.

A cluster's workers need Celery's results on a single Redis apart from the cluster
(`FLEET_RESULT_BACKEND_URL`): Celery's plain client on a cluster node is answered `MOVED` for
most keys and `CROSSSLOT` for the chord join's script, so every explore's join fails and
its trees wait for the owner check. Settings refuse the store's own URL there; a worker
asks the server at start-up (`workers.signals`), so another node's URL is refused too.
"""

from __future__ import annotations

import redis

from fleet.storage.backends.redis.connect import close_client, connect
from fleet.storage.backends.redis.urls import is_sentinel

PROBE_TIMEOUT_S = 2.0


def is_cluster_node(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool | None:
    """True for a node of a Redis Cluster, False for any other Redis; None if unreachable.

    A `sentinel://` URL is a Sentinel group, never a cluster node: False without asking.
    """
    if is_sentinel(url):
        return False
    client = connect(url, timeout_s=timeout_s)
    try:
        info = client.info("cluster")
    except redis.RedisError:
        return None
    finally:
        close_client(client)
    return bool(int(info.get("cluster_enabled", 0)))
