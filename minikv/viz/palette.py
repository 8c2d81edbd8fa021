"""Colours for the pictures: one per tenant, safe for colour-blind readers, red kept for cross-reads, dark
grey for reads of unwritten memory; a workload tenant always gets the same one (alice orange, bob sky
blue, ...: docs/pictures.md)."""

import itertools
from collections.abc import Iterable

from matplotlib.colors import to_hex, to_rgb

from minikv.attacks.workload import TENANTS

TENANT_COLOURS = (  # Okabe-Ito, then Paul Tol's muted; the first five lie far apart in hue
    "#e69f00", "#56b4e9", "#009e73", "#cc79a7", "#332288",  # orange, sky blue, bluish green, reddish purple, indigo
    "#f0e442", "#0072b2", "#117733", "#88ccee", "#999933",  # yellow, blue, green, cyan, olive
    "#aa4499", "#882255", "#ddcc77", "#44aa99",  # purple, wine, sand, teal
)
CROSS_READ = "#d40000"  # red: a request read someone else's data
UNWRITTEN_READ = "#5a5a5a"  # dark grey: a request read memory nobody had written (no one's data)
NEVER_WRITTEN = "#ffffff"  # a page nobody has written since boot
GRID_LINE = "#b0b0b0"  # cell borders
INK = "#000000"  # block-table outline, order numbers, "written this step" marks
STALE_STRENGTH = 0.35  # how much of the writer's colour a stale page keeps (1 = full colour)


def tenant_colours(tenants: Iterable[str]) -> dict[str, str]:
    """A colour per tenant, in order of first appearance: a workload tenant keeps its own, any
    other name gets the next colour no workload tenant in the picture uses."""
    tenants = list(dict.fromkeys(tenants))
    fixed = {t: TENANT_COLOURS[i % len(TENANT_COLOURS)] for i, t in enumerate(TENANTS) if t in tenants}
    spare = itertools.cycle([c for c in TENANT_COLOURS if c not in fixed.values()] or TENANT_COLOURS)
    return {t: fixed[t] if t in fixed else next(spare) for t in tenants}


def faded(colour: str, strength: float = STALE_STRENGTH) -> str:
    """`colour` mixed with white, as "#rrggbb": `strength` 1 keeps it, 0 gives white."""
    return to_hex(tuple(1 - strength + strength * c for c in to_rgb(colour)))
