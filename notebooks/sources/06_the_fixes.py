# %% [markdown]
# # 06 · The fixes, one by one, and what each costs
#
# **What you will learn**
# - the real mitigations the engine's maintainers recommended, each as a switch that changes one code path;
# - which failure path each one closes, shown as a matrix over both incidents;
# - why zeroing freed pages (`scrub_on_free`) hides the symptom without fixing the bug;
# - what each switch costs, measured.
#
# The switches (`minikv/disagg/switches.py`): `reject_check` (the queue gates also retire requests marked
# for abort: the fix in code), `startup_check` (refuse to start when a pool is smaller than the context
# window: still an open proposal upstream), `kv_checksum` (Adler-32 and token count of the KV, verified by
# decode), `kv_canary` (reserved pages are poisoned and must be overwritten before use: our own design),
# `deferred_release` (aborted pages wait for in-flight writes), `transfer_batch_cap` (no transfer batch
# outlasts the timeout), and `scrub_on_free` (zero pages on free: the costly contrast).

# %%
import time

import matplotlib.pyplot as plt
import torch

from minikv.checkpoint import load_model
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.scenarios import BOB_PROMPT_CHARS, run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.viz import find_event, page_map
from minikv.workload import Note, note_prompt

torch.manual_seed(0)
model, tok = load_model()
vulnerable = SafetySwitches.preset("vulnerable")
SECRETS = {"over-length": "5412 7534 9821 0064", "late-write": "sk-live-7Hq2Zp9Xw4"}
print("switches:", ", ".join(SafetySwitches.names()))


# %% [markdown]
# ## The matrix
#
# Each row starts from the vulnerable preset and turns on **one** switch; each column is one incident. A cell
# reads `status / leaked? / cross-tenant reads` for the attacker's response (Bob, or Dave in the late-write
# race of notebook 07).

# %%
def outcome(scenario, switches):
    r = run_scenario(scenario, model, tok, switches, secret=SECRETS[scenario])
    if r.refused:
        return "refused to start"
    leaked = "LEAK" if SECRETS[scenario] in r.attacker.text else "safe"
    return f"{r.attacker.status} / {leaked} / {r.cross_tenant_reads}"

rows = {"(none: vulnerable)": vulnerable}
rows |= {name: vulnerable.with_switches(enable=[name]) for name in SafetySwitches.names()}
rows["(all: safe preset)"] = SafetySwitches.preset("safe")
matrix = {name: {sc: outcome(sc, sw) for sc in SECRETS} for name, sw in rows.items()}
print(f"{'switch on':22s} {'over-length':26s} {'late-write':26s}")
for name, cells in matrix.items():
    print(f"{name:22s} {cells['over-length']:26s} {cells['late-write']:26s}")

# %%
leaks = lambda cell: "LEAK" in cell  # noqa: E731
assert leaks(matrix["(none: vulnerable)"]["over-length"]) and leaks(matrix["(none: vulnerable)"]["late-write"])
for name in ("reject_check", "kv_checksum", "kv_canary"):  # each alone closes the over-length path
    assert not leaks(matrix[name]["over-length"]) and leaks(matrix[name]["late-write"])
for name in ("deferred_release", "transfer_batch_cap"):  # each alone closes the late-write path
    assert leaks(matrix[name]["over-length"]) and not leaks(matrix[name]["late-write"])
assert matrix["startup_check"]["over-length"] == "refused to start"
assert matrix["scrub_on_free"]["over-length"].startswith("200 / safe")  # no secret, but still a 200
assert matrix["(all: safe preset)"]["over-length"] == "refused to start"
assert leaks(matrix["cache_salt"]["over-length"]) and leaks(matrix["cache_salt"]["late-write"])  # notebook 09's
print("every switch closes exactly the path it was built for")

# %% [markdown]
# What `reject_check` changes, in the pools: the decode node still reserved Bob's pages over Alice's stale
# data (hatched), but the prefill gate retired the request, the transfer failed with the reason, and decode
# freed the reservation *without reading it*: no page is marked red.

# %%
fixed = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["reject_check"]), secret=SECRETS["over-length"])
log = fixed.cluster.log
retired = find_event(log, "finish", request_id="bob-1", node="decode")
print(log.events[retired])
assert fixed.cluster.decode_audit.violations == 0 and not log.of_kind("cross_read")
page_map(log, {"prefill": 42, "decode": 125}, at=retired - 1, request="bob-1", page_size=16)

# %% [markdown]
# How to read it:
# - `reject_check` answers Bob **400** with the reason: the bug is gone, not just detected.
# - `kv_checksum` and `kv_canary` answer **500**: decode notices that the KV it is about to read never arrived
#   (one token sent where 800 were expected; the poison still sitting in 49 of 50 pages). They are smoke
#   detectors: they stop the leak and fail loudly, whatever the cause.
# - `startup_check` refuses to start the mismatched cluster at all. Its message says what to change:

# %%
refused = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["startup_check"]))
print(refused.refused)
lowered = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["startup_check"]),
                       secret=SECRETS["over-length"], config=ClusterConfig(context_len=672))
print("with context_len=672:", lowered.attacker.status, lowered.attacker.error)
assert lowered.attacker.status == 400 and SECRETS["over-length"] not in lowered.attacker.text

# %% [markdown]
# This is the maintainers' first recommendation in words: after any change of weights, quantization,
# parallelism or memory fraction, read the KV pool size that **each** prefill and decode node logs at
# startup, and if it is smaller than the context length, lower the context length.

# %%
for line in Cluster(model, tok, ClusterConfig(), SafetySwitches.preset("safe").with_switches(disable=["startup_check"])).startup_log():
    print(line)

# %% [markdown]
# ## Scrubbing hides the symptom
#
# `scrub_on_free` zeroes every page when it is freed. Bob no longer reads Alice's card number, but nothing
# else changed: the rejected request is still admitted, still answered **200**, with `prompt_tokens` of 800,
# and a reply computed over zeros. The bug is intact; only the evidence is gone.

# %%
scrubbed = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["scrub_on_free"]),
                        secret=SECRETS["over-length"])
print(scrubbed.attacker.status, scrubbed.attacker.usage.prompt_tokens, repr(scrubbed.attacker.text))
assert scrubbed.attacker.status == 200 and scrubbed.attacker.usage.prompt_tokens == BOB_PROMPT_CHARS
assert SECRETS["over-length"] not in scrubbed.attacker.text

# %% [markdown]
# ## What each switch costs
#
# Serve the same ordinary traffic (no over-length prompts, no aborts) with the vulnerable preset plus one
# switch, and compare the time with the vulnerable preset alone. The numbers vary from run to run and machine
# to machine; `python -m minikv bench` measures them with repeats.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times)
prompts = [note_prompt(t, Note("pin", f"{i:04d}")) for i, t in enumerate(["alice", "bob", "carol", "dave"] * 4)]
roomy = ClusterConfig(prefill_pages=128, decode_pages=256, event_log=False, audit=False)

def serve_time(switches, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        cluster = Cluster(model, tok, roomy, switches)
        start = time.perf_counter()
        out = cluster.generate(prompts, max_tokens=24)
        best = min(best, time.perf_counter() - start)
    assert all(r.status == 200 for r in out)
    return best

base = serve_time(vulnerable)
costs = {name: serve_time(vulnerable.with_switches(enable=[name])) / base for name in SafetySwitches.names()}
for name, ratio in costs.items():
    print(f"{name:20s} {ratio:5.2f}x the vulnerable preset's time")
assert all(ratio > 0 for ratio in costs.values())

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times)
fig, ax = plt.subplots(figsize=(6, 2.8))
ax.barh(list(costs), list(costs.values()), color="#0072B2")
ax.axvline(1.0, color="black", lw=0.8)
ax.set_xlabel("time / time with no switch"); ax.set_title("Cost of each switch on ordinary traffic")
plt.tight_layout(); plt.show()

# %% [markdown]
# On this tiny model the costs are small and noisy; the shape to remember is where each cost lands.
# `reject_check` and `startup_check` cost nothing on the normal path. `kv_checksum` reads every transferred
# byte twice. `kv_canary` writes every reserved page once more. `transfer_batch_cap` adds one wire latency
# per batch. `scrub_on_free` writes every freed page, which on a real GPU competes with the model for memory
# bandwidth, and is why engines do not do it.
#
# The benchmark measures the same costs on 32 requests, 5 interleaved repeats, next to `transformers`'
# own generation. This is the figure committed beside the README, from the machine that measured it
# (`python -m minikv bench --plot docs/bench.png`, about two minutes on 2 CPU cores):

# %%
from IPython.display import Image

from minikv.checkpoint import REPO_ROOT

figure = REPO_ROOT / "docs" / "bench.png"
assert figure.exists(), f"{figure} is missing: run python -m minikv bench --plot docs/bench.png"
Image(filename=str(figure), width=720)


# %% [markdown]
# ## Exercises
#
# **1.** The checksum compares what prefill *sent* with what decode *expected*. Write down what each side
# computes in the over-length case (tokens, pages), then check with
# `run_scenario(..., vulnerable.with_switches(enable=["kv_checksum"]))` and read the attacker's error.
#
# **2.** Turn on `kv_canary` alone and read the error: how many of Bob's prompt pages still held the poison?
# Compute it from the page size and the prompt length, and check:

# %%
def poisoned_pages(prompt_tokens, page_size, tokens_transferred):
    raise NotImplementedError  # your code here

try:
    got = poisoned_pages(BOB_PROMPT_CHARS, 16, 1)
    canary = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["kv_canary"]))
    assert f"intact in {got} of" in canary.attacker.error, canary.attacker.error
    print("correct:", canary.attacker.error)
except NotImplementedError:
    print("not solved yet: write poisoned_pages, then run this cell again")


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: every prompt page except those the transfer overwrote still holds the canary.
def poisoned_pages(prompt_tokens, page_size, tokens_transferred):
    return -(-prompt_tokens // page_size) - -(-tokens_transferred // page_size)

canary = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["kv_canary"]))
assert f"intact in {poisoned_pages(BOB_PROMPT_CHARS, 16, 1)} of" in canary.attacker.error
print("correct:", canary.attacker.error)

# %% [markdown]
# **3.** Which switches would you ship, and which would you leave off? Defend the choice with the matrix and the
# costs above. (The maintainers shipped the queue check, recommended the KV checksum, deferred release and the
# batch cap, and left a startup refusal as an open proposal.)
