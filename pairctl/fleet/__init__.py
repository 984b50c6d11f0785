"""Fleet: several independent pairs behind one vLLM router, with conversation affinity.

One inventory file (`pairs/fleet.yaml`, see `pairs/fleet.yaml.example`) lists the pairs
(each still its own `pairs/*.env`, brought up by its own `pairctl up` on its own head) and
where
the router runs. `launch/dspark_launch.sh fleet plan|up|down|status|prometheus|alert-floors`
is the front door; docs/fleet.md explains the design and the router settings.
"""

# Exit codes of `launch/dspark_launch.sh fleet ...`: defined, with their meanings, in
# pairctl.contracts.FLEET_EXITS (docs/INTERFACES.md is generated from it).
from pairctl.contracts import FLEET_EXITS

_CODES = {e.name: e.code for e in FLEET_EXITS}
EXIT_OK = _CODES["EXIT_OK"]
EXIT_ERROR = _CODES["EXIT_ERROR"]
EXIT_USAGE = _CODES["EXIT_USAGE"]
EXIT_PREFLIGHT = _CODES["EXIT_PREFLIGHT"]
EXIT_PAIRS = _CODES["EXIT_PAIRS"]
EXIT_ROUTER = _CODES["EXIT_ROUTER"]
EXIT_DEGRADED = _CODES["EXIT_DEGRADED"]
EXIT_DOWN = _CODES["EXIT_DOWN"]

LABEL_FLEET = "dsv4.fleet"
ROUTER_ROLE = "router"
