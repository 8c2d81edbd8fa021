"""`serve --mystery SEED`: a server whose safety switches are drawn from SEED alone, for an audit from the
outside (notebook 13). The rest is fixed: the in-process pair, a 1,024-token window, the incident's prefill
pool (the post-fix one if `startup_check` is drawn on: it would refuse the other). Nothing it shows
(startup lines, /health, the engine's refusals) names a switch."""

import argparse
import random

from minikv.disagg.cluster import POST_FIX_PREFILL_PAGES, ClusterConfig
from minikv.disagg.switches import SafetySwitches

MYSTERY_CONTEXT_LEN = 1024  # the incident's window, scaled by 1/1024 (docs/incident.md)
INCIDENT_PREFILL_PAGES = ClusterConfig().prefill_pages  # 672 tokens: less than the window
MIN_TENANTS = 2  # an audit from the outside needs two keys of its own
FIXED_BY_SEED = {  # the flags --mystery decides, at the parser's defaults
    "preset": None, "enable": [], "disable": [], "disagg": False, "transport": "inprocess",
    "context_len": None, "prefill_chunk": None}


def draw(seed: int) -> SafetySwitches:
    """Each switch on or off, a fair coin each, from `seed` alone: the same in every process (a string seeds
    `random.Random` through SHA-512, never through Python's per-process string hash)."""
    assert isinstance(seed, int) and seed >= 0, f"a mystery seed is a whole number >= 0, got {seed!r}"
    rng = random.Random(f"minikv-mystery-{seed}")
    return SafetySwitches(**{name: rng.random() < 0.5 for name in SafetySwitches.names()})


def prefill_pages(switches: SafetySwitches) -> int:
    """The prefill pool the operator configured: the incident's, or the post-fix one under startup_check."""
    return POST_FIX_PREFILL_PAGES if switches.startup_check else INCIDENT_PREFILL_PAGES


def check_mystery_args(args: argparse.Namespace, tenants: int) -> None:
    """ValueError naming the first flag that would choose what the seed draws, or too few keys to audit."""
    for name, default in FIXED_BY_SEED.items():
        if getattr(args, name) != default:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} cannot be given with --mystery: the seed decides the switches and the "
                             "server")
    if tenants < MIN_TENANTS:
        raise ValueError(f"--mystery needs {MIN_TENANTS} tenants or more (--api-key TENANT=KEY for each), "
                         f"got {tenants}: an audit compares two keys")

