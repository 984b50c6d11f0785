"""What makes a group of Sparks: a pair, or four as one engine (SPARK3/SPARK4).

The env file's rules for a group, kept apart from the per-variable validation
(pairctl.pair.config): SPARK3 and SPARK4 both or neither, FABRIC3/FABRIC4 only with them,
a ring only of four, and every node and fabric address of a group of four distinct.
"""

from __future__ import annotations

from pairctl.pair.cabling import RING, SETTINGS

# The ways a group's fabric is cabled (pairctl.pair.cabling holds what each needs).
CABLINGS = tuple(SETTINGS)
# A group is a pair or four Sparks: TP must divide the model's 128 attention heads, so a
# third Spark is no TP size (tonyd2wild/Deepseek-V4-Flash-TP4-4x-DGX-Spark
# launch/tp4-4x-spark-launch.sh, "HEAD-COUNT RULE").
GROUP_SIZES = (2, 4)


def group_problem(out: dict[str, str]) -> str | None:
    """SPARK3/SPARK4 both or neither (a group is 2 or 4 Sparks: GROUP_SIZES), FABRIC3/FABRIC4
    only with them, every node and fabric address distinct, a ring only with four."""
    have = [n for n in ("SPARK3", "SPARK4") if out[n]]
    if len(have) == 1:
        other = "SPARK4" if have == ["SPARK3"] else "SPARK3"
        return (
            f"{have[0]} is set but {other} is not; a group is 2 or 4 Sparks: "
            f"set both SPARK3 and SPARK4 (four Sparks, TP=4) or neither (a pair)"
        )
    n = GROUP_SIZES[1] if have else GROUP_SIZES[0]
    for extra in ("FABRIC3", "FABRIC4"):
        if out[extra] and n == 2:
            return (
                f"{extra} is set without SPARK3/SPARK4; it is a rank of a group "
                "of four: set SPARK3 and SPARK4 too, or empty it"
            )
    if out["CABLING"] == RING and n == 2:
        return (
            "CABLING=ring needs four Sparks (0-1-2-3-0); a pair is one cable: "
            "set SPARK3 and SPARK4, or CABLING=switched (the default)"
        )
    # A pair's FABRIC1 == FABRIC2 stays preflight's to fail (PF-FABRIC-ADDR), as before.
    for kind in ("SPARK", "FABRIC") if n > 2 else ():
        seen: dict[str, str] = {}
        for r in range(1, n + 1):
            name = f"{kind}{r}"
            addr = (out[name] or out[f"SPARK{r}"]).lower()
            if addr in seen:
                return (
                    f"{name} and {seen[addr]} are both {addr}; every Spark of "
                    f"the group needs its own address: fix {name}"
                )
            seen[addr] = name
    return None
