"""`serve --mystery SEED`: a server whose safety switches are drawn from SEED alone, for an audit from the
outside (notebook 13). Everything else is fixed: the in-process prefill/decode pair (the one door where every
switch acts), a 1,024-token window, prefill in the default chunks, and the incident's 672-token prefill pool,
unless `startup_check` is drawn on: that switch would refuse such a pool, so the operator gave it the disclosed
post-fix 2,000 tokens. The server then says nothing of its switches: no startup line names them or the pools,
`/health` is liveness only (even for the operator's key), and a refusal from inside the engine carries its
status and fixed words."""

import argparse
import random

from minikv.disagg.cluster import POST_FIX_PREFILL_PAGES, ClusterConfig
from minikv.disagg.switches import SafetySwitches

MYSTERY_CONTEXT_LEN = 1024  # the incident's window, scaled by 1/1024 (docs/incident.md)
INCIDENT_PREFILL_PAGES = ClusterConfig().prefill_pages  # 672 tokens: less than the window
MIN_TENANTS = 2  # an audit from the outside needs two keys of its own
FIXED_BY_SEED = {"preset": None, "enable": [], "disable": [], "disagg": False, "transport": "inprocess",
                 "context_len": None, "prefill_chunk": None}  # flags --mystery decides: as the parser's defaults


def draw(seed: int) -> SafetySwitches:
    """Each switch on or off, a fair coin each, from `seed` alone: the same switches in every process and run
    (a string seeds `random.Random` through SHA-512, never through Python's per-process string hash)."""
    assert isinstance(seed, int) and seed >= 0, f"a mystery seed is a whole number >= 0, got {seed!r}"
    rng = random.Random(f"minikv-mystery-{seed}")
    return SafetySwitches(**{name: rng.random() < 0.5 for name in SafetySwitches.names()})


def prefill_pages(switches: SafetySwitches) -> int:
    """The prefill pool the operator configured: the incident's, or the post-fix one where startup_check would
    otherwise have refused to start."""
    return POST_FIX_PREFILL_PAGES if switches.startup_check else INCIDENT_PREFILL_PAGES


def check_mystery_args(args: argparse.Namespace, tenants: int) -> None:
    """ValueError naming the first flag that would choose what the seed draws, or too few keys for an audit."""
    for name, default in FIXED_BY_SEED.items():
        if getattr(args, name) != default:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} cannot be given with --mystery: the seed decides the switches and the server")
    if tenants < MIN_TENANTS:
        raise ValueError(f"--mystery needs {MIN_TENANTS} tenants or more (--api-key TENANT=KEY for each), "
                         f"got {tenants}: an audit compares two keys")

