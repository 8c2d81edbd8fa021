"""`minikv probe` against real servers: the vulnerable cluster fails, the safe one passes.

The clusters, whose over-length verdict rests on times to first token, each get a process of their own; the
other servers run on threads of this process over the session's model (`ServerThread`, as notebook 11 starts
them). The probe is always a child process that reaches them over HTTP only.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from minikv.probe.canary import holds_canary
from minikv.probe.session import TokenScale, random_words
from minikv.probe.report import FAIL, INCOMPLETE, PASS, CheckResult, ProbeReport
from minikv.serve.launch import ServerProcess, ServerThread, free_port

KEY_A, KEY_B = "sk-alice-0001", "sk-bob-0002"
KEYS = ["--api-key", f"alice={KEY_A}", "--api-key", f"bob={KEY_B}"]
ROUNDS = "6"  # prefix-cache rounds: enough for the KS test, short enough for a test


def probe(url: str, *extra: str) -> tuple[int, dict | None, str]:
    r = subprocess.run([sys.executable, "-m", "minikv", "probe", url, "--key", KEY_A, "--key", KEY_B, "--seed", "0",
                        "--rounds", ROUNDS, "--json", *extra], capture_output=True, text=True, timeout=600)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else None), r.stderr


def verdicts(report: dict) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in report["checks"]}


def test_probe_fails_the_vulnerable_cluster():
    """Vulnerable disaggregated server: over-length answered 200 unread, key A's canary returned to key B; exit 1."""
    with ServerProcess(["--disagg", "--preset", "vulnerable", *KEYS]) as server:
        status, report, _ = probe(server.url)
    v = verdicts(report)
    assert status == 1 and v["over-length"] == FAIL and v["canary"] == FAIL
    canary = next(c for c in report["checks"] if c["name"] == "canary")
    assert "returned key A's canary" in canary["reason"]


def test_probe_passes_the_safe_cluster():
    """Safe disaggregated server (window = prefill pool): every check passes; exit 0."""
    with ServerProcess(["--disagg", "--preset", "safe", "--context-len", "672", *KEYS]) as server:
        status, report, _ = probe(server.url)
    assert status == 0 and set(verdicts(report).values()) == {PASS}
    assert report["requests_sent"] <= 200


@pytest.fixture(scope="module")
def unsalted_server(tiny):
    """One engine that shares its prefix cache across tenants (a gateway in front may still salt): neither salted
    nor partitioned, since the partition alone keeps each tenant's hits its own."""
    with ServerThread(["--disable", "cache_salt", "--disable", "cache_partition", *KEYS], *tiny) as server:
        yield server


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def test_probe_detects_a_prefix_cache_shared_across_keys(unsalted_server):
    """One engine without cache_salt: key B hits key A's cached prefix; the audit says shared, and by which oracle."""
    status, report, _ = probe(unsalted_server.url, "--rounds", "12")
    audit = check(report, "shared prefix cache")
    assert status == 1 and audit["verdict"] == FAIL and "cached_tokens" in audit["figures"]["oracle"]


def test_salt_per_key_closes_the_shared_prefix_cache(unsalted_server):
    """The same engine behind a gateway that salts per key (--salt-per-key): B never hits A's prompts; A still hits its own."""
    status, report, _ = probe(unsalted_server.url, "--rounds", "12", "--check", "prefix-cache", "--salt-per-key")
    audit = check(report, "shared prefix cache")
    assert status == 0 and report["salt_per_key"] and audit["verdict"] == PASS, audit
    assert "per key" in audit["reason"] and "decided by cached_tokens" in audit["reason"]


def test_probe_cannot_reach_is_exit_2():
    """Nothing listening: exit 2 with a one-line error."""
    status, report, stderr = probe(f"http://127.0.0.1:{free_port()}")
    assert status == 2 and report is None and stderr.startswith("error: cannot reach") and "Traceback" not in stderr


def test_probe_needs_two_keys():
    """One key is not enough: exit 2."""
    r = subprocess.run([sys.executable, "-m", "minikv", "probe", "http://127.0.0.1:1", "--key", KEY_A],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: give two different keys")


@pytest.fixture(scope="module")
def single_server(tiny):
    with ServerThread(KEYS, *tiny) as server:
        yield server


def test_probe_wrong_key_is_exit_2(single_server):
    """A key the endpoint refuses: exit 2, naming the masked key."""
    r = subprocess.run([sys.executable, "-m", "minikv", "probe", single_server.url, "--key", KEY_A, "--key", "sk-nobody-999"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "401" in r.stderr and "sk-nobody-999" not in r.stderr


def test_probe_stops_at_its_budget(single_server):
    """A budget too small for all checks: never more requests than allowed, and exit 2 (incomplete)."""
    status, report, stderr = probe(single_server.url, "--budget", "20")
    assert status == 2, stderr
    assert report["requests_sent"] <= 20 and INCOMPLETE in verdicts(report).values()


def test_token_scale_sizes_prompts():
    """A fitted scale inverts: words_for stays within the tokens, words_over goes past them."""
    scale = TokenScale.fit((8, 40), (16, 80))  # the shipped tokenizer: 2 tokens a word
    assert (scale.per_word, scale.overhead) == (2.0, 0.0)
    assert scale.tokens(scale.words_for(1000)) <= 1000 < scale.tokens(scale.words_over(1000))
    prompt = random_words(random.Random(0), 8)
    assert len(prompt) == 16 and prompt.endswith("\n")


def test_canary_match_needs_eight_characters():
    """A shared run of 8 canary characters counts; 7 does not."""
    assert holds_canary("saved key xxABCDEFGHyy.", "ABCDEFGHIJKLMNOP")
    assert not holds_canary("saved key ABCDEFG.", "ABCDEFGHIJKLMNOP")


def test_exit_status():
    """Any fail is 1; otherwise anything unfinished is 2; all passed is 0."""
    def exit_status(verdicts: list[str]) -> int:
        return ProbeReport("http://x/v1", "m", 64, [], results=[CheckResult("x", v) for v in verdicts]).status
    assert exit_status([PASS, PASS]) == 0
    assert exit_status([PASS, INCOMPLETE]) == 2
    assert exit_status([INCOMPLETE, FAIL]) == 1


# --- the prefix-cache audit against a simulated endpoint ---------------------------------------------

def simulated_endpoint(shared: bool, report_cached: bool, bodies: list[dict] | None = None):
    """An httpx transport playing an endpoint with a prefix cache: a cached prompt skips prefill time.

    A shared cache is still split by the request's `cache_salt`, as vLLM's is; `bodies` collects what was sent.
    """
    import time

    import httpx

    seen: set[tuple[str, str]] = set()
    bodies = [] if bodies is None else bodies

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "sim", "max_model_len": 1024}]})
        body = json.loads(request.content)
        bodies.append(body)
        owner = body.get("cache_salt", "") if shared else request.headers["authorization"]
        hit = (owner, body["prompt"]) in seen
        seen.add((owner, body["prompt"]))
        tokens = len(body["prompt"])
        time.sleep(0.002 + (0 if hit else 0.00004 * tokens))  # prefill: 40 us a token, skipped on a hit
        usage = {"prompt_tokens": tokens, "completion_tokens": 1,
                 **({"prompt_tokens_details": {"cached_tokens": tokens if hit else 0}} if report_cached else {})}
        events = [{"choices": [{"text": "x"}]}, {"choices": [], "usage": usage}]
        return httpx.Response(200, text="".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")

    return httpx.MockTransport(handle)


def simulated_audit(transport, salt_per_key: bool = False) -> CheckResult:
    from minikv.probe.client import ProbeClient
    from minikv.probe.prefix_cache import check_prefix_cache
    from minikv.probe.session import ProbeSession, calibrate

    client = ProbeClient("http://sim", 200, 120, transport=transport, salt_per_key=salt_per_key)
    client.model = "sim"
    rng = random.Random(0)
    session = ProbeSession(client, KEY_A, KEY_B, 1024, calibrate(client, KEY_A, rng), rng)
    result = CheckResult("shared prefix cache")
    check_prefix_cache(session, result, rounds=12)
    return result


@pytest.mark.parametrize("shared,report_cached,verdict,oracle", [
    (True, True, FAIL, "cached_tokens"), (True, False, FAIL, "time to first token (KS test)"),
    (False, True, PASS, "cached_tokens"), (False, False, PASS, "time to first token (KS test)"),
])
def test_prefix_audit_tells_shared_from_per_key_caches(shared, report_cached, verdict, oracle):
    """Gu et al.'s audit: a cache shared across keys fails (by timing alone too); a per-key cache passes;
    the reason names the oracle that decided."""
    result = simulated_audit(simulated_endpoint(shared, report_cached))
    assert result.verdict == verdict, result.format()
    assert result.figures["oracle"].startswith(oracle) and f"decided by {oracle}" in result.reason
    if verdict == PASS:
        assert "per key" in result.reason


def test_salt_per_key_sends_a_salt_of_each_key_never_the_key():
    """--salt-per-key: every request carries its key's own cache_salt (a hash); a shared cache then passes."""
    bodies: list[dict] = []
    result = simulated_audit(simulated_endpoint(True, True, bodies), salt_per_key=True)
    assert result.verdict == PASS, result.format()
    salts = {b["cache_salt"] for b in bodies}
    assert len(salts) == 2 and not any(k in salt or salt in k for salt in salts for k in (KEY_A, KEY_B))
    unsalted: list[dict] = []
    simulated_audit(simulated_endpoint(True, True, unsalted))
    assert not any("cache_salt" in b for b in unsalted)
