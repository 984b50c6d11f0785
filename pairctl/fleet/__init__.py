"""Fleet: several independent pairs behind one vLLM router, with conversation affinity.

One inventory file (`pairs/fleet.yaml`, see `pairs/fleet.yaml.example`) lists the pairs
(each still its own `pairs/*.env`, brought up by its own launcher on its own head) and where
the router runs. `launch/dspark_launch.sh fleet plan|up|down|status|prometheus` is the front
door; docs/fleet.md explains the design and the router settings.
"""

# Exit codes of `launch/dspark_launch.sh fleet ...` (docs/INTERFACES.md). 0, 2 and 3 mean
# what they mean for one pair; 4 and 5 are the fleet's own.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3  # router host unreachable, router image missing, or the fleet lock is held
EXIT_PAIRS = 4  # some pair(s) did not come up; the others and the router did (summary names them)
EXIT_ROUTER = 5  # the router did not become ready

LABEL_FLEET = "dsv4.fleet"
ROUTER_ROLE = "router"
