"""How every client finds the fleet: `FLEET_REDIS_URL`, else the nearest `fleet up`.

One discovery for the CLI (`fleetops.discovery.fleet_settings`), `Fleet.from_env()` and
every program that uses them. `fleet up` writes `up.json` (what it started, its Redis
password included) into its state folder, which is never inside the directory it runs in:
FLEET_STATE_DIR, else `$XDG_STATE_HOME/agent-fleet/<hash of the directory>`
(`Settings.fleet_state_dir`). An agent can write anything in its workspace, so nothing
there is read: a process in a directory looks up the state folder of that directory, then
of each one above it (like git with `.git`), and trusts an `up.json` only when the user
owns it and no one else can read or write it or its folder (like git's `safe.directory`);
any other is ignored with a warning.

When neither says where, the default Redis (`redis://localhost:6379/0`) is what is left:
a client says so once (a warning on the `fleet.discovery` logger, which Python prints on
stderr when nothing configured logging) and `Fleet.from_env` refuses to write there unless
a live worker of the fleet answers (`fleet.client`), so an unrelated Redis on the default
port is never written to.
"""

from fleet.discovery.find import (
    PING_TIMEOUT_S,
    Found,
    Source,
    client_settings,
    discover,
    discover_redis_url,
    redis_answers,
    url_chosen,
)
from fleet.discovery.state import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    UP_FILE,
    UpState,
    find_state_dir,
    read_state,
    trusted_state_file,
)

__all__ = [
    "PING_TIMEOUT_S",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "UP_FILE",
    "Found",
    "Source",
    "UpState",
    "client_settings",
    "discover",
    "discover_redis_url",
    "find_state_dir",
    "read_state",
    "redis_answers",
    "trusted_state_file",
    "url_chosen",
]
