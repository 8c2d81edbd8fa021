"""The probe's side-channel checks: the shared eviction order (prime and probe) and the inter-token gap.

Against a simulated paged cache (an httpx transport) the eviction check must tell a pool whose
least-recently-used order is shared across keys from one split per key; against the real
`minikv serve` it must find the channel that is open there today, on both presets.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

import httpx
import pytest
from scipy.stats import mannwhitneyu
from test_probe import KEY_A, KEY_B, KEYS, check, probe

from minikv.probe.report import FAIL, INCOMPLETE, INFO, PASS
from minikv.probe.run import probe_endpoint
from minikv.probe.token_gaps import largest_gap, roc_auc
from minikv.serve.launch import ServerThread

PAGE, PAGES = 16, 256  # the simulated pool: minikv's default, 4,096 tokens


class PagedCache:
    """Pages with a prefix cache: full prompt pages stay parked after a request, matchable, and are
    evicted least recently used first; a request's last page is parked first (evicted first)."""

    def __init__(self) -> None:
        self.free = PAGES
        self.parked: OrderedDict[bytes, None] = OrderedDict()

    def serve(self, salt: str, prompt: str) -> int:
        """Run one request; the prompt tokens it found cached."""
        keys = [hashlib.blake2b((salt + prompt[:end]).encode(), digest_size=8).digest()
                for end in range(PAGE, len(prompt) + 1, PAGE)]
        hits = next((i for i, k in enumerate(keys) if k not in self.parked), len(keys))
        for key in keys:
            self.parked.pop(key, None)
        held = -(-(len(prompt) + 1) // PAGE)  # pages for the prompt and one generated token
        for _ in range(held - hits):
            if self.free:
                self.free -= 1
            else:
                self.parked.popitem(last=False)
        for key in reversed(keys):
            self.parked[key] = None
        self.free += held - len(keys)
        return hits * PAGE


def simulated_engine(per_key_pools: bool, caching: bool = True, report_cached: bool = True) -> httpx.MockTransport:
    """One shared pool (every key's pages in one LRU, keys salted apart) or a pool of the same size per key."""
    pools: dict[str, PagedCache] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "sim", "max_model_len": 1024}]})
        body, key = json.loads(request.content), request.headers["authorization"]
        pool = pools.setdefault(key if per_key_pools else "", PagedCache())
        cached = pool.serve(key, body["prompt"]) if caching else 0
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"],
                 **({"prompt_tokens_details": {"cached_tokens": cached}} if report_cached else {})}
        events = [{"choices": [{"text": "x"}]}, {"choices": [], "usage": usage}]
        return httpx.Response(200, text="".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")

    return httpx.MockTransport(handle)


def eviction_on(transport: httpx.MockTransport) -> dict:
    report = probe_endpoint("http://sim", KEY_A, KEY_B, transport=transport, seed=0, checks=("eviction",))
    return report.to_json()["checks"][0]


def test_eviction_check_fails_one_lru_for_every_key():
    """Salted keys, one LRU: B's oldest prompt keeps more after A repeated itself, by A's hidden cached_tokens."""
    result = eviction_on(simulated_engine(per_key_pools=False))
    assert result["verdict"] == FAIL, result
    figures = result["figures"]
    assert abs(figures["pool_tokens"] - PAGE * PAGES) <= 2 * PAGE  # measured from B's side
    gap = min(figures["b_readings"]["repeat"]) - max(figures["b_readings"]["fresh"])
    assert gap == min(figures["a_cached_tokens"]["repeat"]) > 0
    assert figures["variants"] == {"cache order": FAIL, "held pages": FAIL}


def test_eviction_check_passes_a_pool_per_key():
    """The same pool size for each key on its own: nothing A sends moves B's readings."""
    result = eviction_on(simulated_engine(per_key_pools=True))
    assert result["verdict"] == PASS, result
    readings, held = result["figures"]["b_readings"], result["figures"]["held_pages"]["b_survivors"]
    assert len(set(readings["repeat"] + readings["fresh"])) == 1 and len(set(held["repeat"] + held["fresh"])) == 1
    assert min(held["repeat"]) > 0 and result["figures"]["variants"] == {"cache order": PASS, "held pages": PASS}


def test_eviction_check_without_a_cache_or_without_cached_tokens():
    assert eviction_on(simulated_engine(False, caching=False))["verdict"] == PASS
    assert eviction_on(simulated_engine(False, report_cached=False))["verdict"] == INCOMPLETE


def test_roc_auc_and_largest_gap():
    assert roc_auc([3.0, 4.0], [1.0, 2.0]) == 1.0 and roc_auc([1.0, 2.0], [3.0, 4.0]) == 0.0
    assert roc_auc([1.0, 2.0], [1.0, 2.0]) == 0.5
    times = (0.0, 0.01, 0.02, 0.09, 0.10)  # a 70 ms gap while A's request ran (0.03 to 0.085)
    assert largest_gap(times, 0.03, 0.085) == pytest.approx(0.07)
    assert largest_gap(times, 0.03, 0.2) is None  # B's stream ended before A's request did


# --- against minikv serve -------------------------------------------------------------------------

CHANNELS = ("--check", "eviction", "--check", "token-gaps")


@pytest.fixture(scope="module")
def safe_report(tiny) -> tuple[int, dict]:
    with ServerThread(["--preset", "safe", *KEYS], *tiny) as server:
        status, report, stderr = probe(server.url, *CHANNELS)
    assert report is not None, stderr
    return status, report


def test_eviction_check_fails_vulnerable_minikv(tiny):
    """The vulnerable preset shares one LRU across tenants: the prime-and-probe check fails, exit 1."""
    with ServerThread(["--preset", "vulnerable", *KEYS], *tiny) as server:
        status, report, stderr = probe(server.url, "--check", "eviction")
    eviction = check(report, "shared eviction order")
    assert status == 1 and eviction["verdict"] == FAIL, stderr
    assert min(eviction["figures"]["a_cached_tokens"]["repeat"]) > 0


def test_safe_minikv_passes_the_eviction_check(safe_report):
    """The safe preset's cache_partition: A's requests never evict B's cached pages, and B's holds count against
    B's quota alone, so B reads nothing of A in either variant; the holds did evict some of B's own pages."""
    _, report = safe_report
    eviction = check(report, "shared eviction order")
    if eviction["verdict"] not in (PASS, FAIL):
        raise RuntimeError(f"the eviction check did not finish: {eviction['reason']}")  # not the expected failure
    assert eviction["verdict"] == PASS, eviction["reason"]
    figures = eviction["figures"]
    survivors = figures["held_pages"]["b_survivors"]
    assert figures["variants"] == {"cache order": PASS, "held pages": PASS}, figures
    every = survivors["repeat"] + survivors["fresh"]  # the same, but for holds admitted a step or two apart
    assert 0 < min(every) and max(every) - min(every) <= 64 and max(every) < figures["pool_tokens"], figures
    assert min(figures["held_pages"]["a_cached_tokens"]["repeat"]) > 0  # A's repeats did hit A's own cache


def test_held_pages_fail_a_shared_pool_with_salts(tiny):
    """Salted but not partitioned (`--preset safe --disable cache_partition`: one pool, a free stack and an LRU
    for every key): the held-pages variant tells on its own figures. B's holds take what A's pages left of the
    pool, so B's own surviving cached tokens drop, after A's fresh prompt, by about what A's repeat hid."""
    with ServerThread(["--preset", "safe", "--disable", "cache_partition", *KEYS], *tiny) as server:
        status, report, stderr = probe(server.url, "--check", "eviction")
    eviction = check(report, "shared eviction order")
    assert status == 1 and eviction["verdict"] == FAIL and eviction["figures"]["variants"]["held pages"] == FAIL, stderr
    held = eviction["figures"]["held_pages"]
    gap = min(held["b_survivors"]["repeat"]) - max(held["b_survivors"]["fresh"])
    assert abs(gap - min(held["a_cached_tokens"]["repeat"])) <= 64, held  # within 4 pages of 16 tokens
    assert "held pages" in eviction["reason"] and min(held["hold_tokens"]) > 0


def test_token_gap_residual_is_measured_and_never_changes_the_exit_status(safe_report):
    """B's largest inter-token gap, beside each of A's hits and misses, gives an AUC that is the Mann-Whitney
    statistic of the gaps it reports; the verdict's AUC is the larger of it and the summed delay's (how large
    depends on the machine's load: not asserted); the verdict is INFO, so only eviction sets the exit."""
    status, report = safe_report
    gaps = check(report, "inter-token gap")
    figures = gaps["figures"]
    misses, hits = figures["gap_ms"]["miss"], figures["gap_ms"]["hit"]
    assert gaps["verdict"] == INFO and figures["trials"] == 6 and figures["a_prompt_tokens"] > 0
    assert min(len(misses), len(hits)) >= 3 and len(misses) + len(hits) <= 2 * figures["trials"]
    pairs = len(misses) * len(hits)  # gaps are reported to 0.01 ms: a rounded pair may tie
    assert figures["auc_largest_gap"] == pytest.approx(mannwhitneyu(misses, hits).statistic / pairs, abs=1 / pairs)
    assert figures["auc"] == max(figures["auc_largest_gap"], figures["auc_summed_delay"]), gaps
    assert status == (1 if check(report, "shared eviction order")["verdict"] == FAIL else 0)
