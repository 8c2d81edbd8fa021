"""Colours for the pictures: one per tenant, safe for colour-blind readers, plus the marks.

Tenant colours come from the Okabe-Ito palette and Paul Tol's "muted" one (distinguishable under
the common forms of colour blindness), without vermillion and red, which are kept for the one
thing that must stand out: a cross-tenant read, drawn in red with a crossed hatch. A tenant of
the workload (`minikv.attacks.workload.TENANTS`) always gets the same colour, in every picture of every
notebook: alice orange, bob sky blue, carol green, dave purple, erin indigo (bob and dave meet
in the same pictures, so only one of them is blue). A freed page that still holds data is drawn
in its last writer's colour, faded toward white.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from matplotlib.colors import to_hex, to_rgb

from minikv.attacks.workload import TENANTS

TENANT_COLOURS = (  # the first five, the tenants most pictures draw, lie far apart in hue
    "#e69f00",  # orange
    "#56b4e9",  # sky blue
    "#009e73",  # bluish green
    "#cc79a7",  # reddish purple
    "#332288",  # indigo (Tol muted)
    "#f0e442",  # yellow
    "#0072b2",  # blue
    "#117733",  # green (Tol muted from here on)
    "#88ccee",  # cyan
    "#999933",  # olive
    "#aa4499",  # purple
    "#882255",  # wine
    "#ddcc77",  # sand
    "#44aa99",  # teal
)
CROSS_READ = "#d40000"  # red: a request read someone else's data
NEVER_WRITTEN = "#ffffff"  # a page nobody has written since boot
GRID_LINE = "#b0b0b0"  # cell borders
INK = "#000000"  # block-table outline, order numbers, "written this step" marks
STALE_STRENGTH = 0.35  # how much of the writer's colour a stale page keeps (1 = full colour)


def tenant_colours(tenants: Iterable[str]) -> dict[str, str]:
    """A colour per tenant, in order of first appearance.

    A workload tenant keeps its own colour whatever else is drawn (alice is always orange);
    any other name gets the next colour no workload tenant in the picture uses.
    """
    tenants = list(dict.fromkeys(tenants))
    fixed = {t: TENANT_COLOURS[i % len(TENANT_COLOURS)] for i, t in enumerate(TENANTS) if t in tenants}
    spare = itertools.cycle([c for c in TENANT_COLOURS if c not in fixed.values()] or TENANT_COLOURS)
    return {t: fixed[t] if t in fixed else next(spare) for t in tenants}


def faded(colour: str, strength: float = STALE_STRENGTH) -> str:
    """`colour` mixed with white, as "#rrggbb": `strength` 1 keeps it, 0 gives white."""
    return to_hex(tuple(1 - strength + strength * c for c in to_rgb(colour)))
