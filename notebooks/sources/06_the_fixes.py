# %% [markdown]
# # 06 · The fixes, one by one, and what each costs
#
# **The code it teaches:** `minikv/disagg/switches.py` (every mitigation), `minikv/disagg/decode_node.py` (the checksum and canary checks), `minikv/disagg/checksum.py` (Adler-32) and `minikv/disagg/cluster.py` (`startup_check`).
#
# **What you will learn**
# - the fixes in the engine and the mitigations its maintainers recommended, each as a switch that changes
#   one code path;
# - which failure path each one closes, shown as a matrix over both incidents;
# - the operators' own fix: a prefill pool large enough for the context window;
# - why zeroing freed pages (`scrub_on_free`) hides the symptom without fixing the bug;
# - what each switch costs, measured.
#
# The maintainers' first recommendation is to **upgrade** to the engine release with the fixes; here that
# release is `reject_check`. Their other recommendations are the rest of the switches below (the facts, with
# their order, are in `docs/incident.md`).
#
# The switches (`minikv/disagg/switches.py`): `reject_check` (the queue gates also retire requests marked
# for abort: the fix in code), `startup_check` (refuse to start when a pool is smaller than the context
# window: still an open proposal upstream), `kv_checksum` (Adler-32 and token count of the KV, verified by
# decode), `kv_canary` (reserved pages are poisoned and must be overwritten before use: our own design),
# `deferred_release` (aborted pages wait for in-flight writes), `transfer_batch_cap` (no transfer batch
# outlasts the timeout), and `scrub_on_free` (zero pages on free: the costly contrast).

# %%
import random
import statistics
import time

import matplotlib.pyplot as plt
import torch

from minikv.model.checkpoint import load_model
from minikv.disagg.cluster import POST_FIX_PREFILL_PAGES, Cluster, ClusterConfig
from minikv.attacks.scenarios import BOB_PROMPT_CHARS, run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.exercises import try_exercise
from minikv.exercises.nb06_fixes import check_adler32, check_poisoned_pages
from minikv.viz import find_event, page_map
from minikv.attacks.workload import Note, expected_reply, long_document_prompt, note_prompt

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
partitioned = run_scenario("late-write", model, tok, rows["cache_partition"], secret=SECRETS["late-write"])
marked = [e for e in partitioned.cluster.log.for_request("carol-1") if e.kind == "reject"]
print(f"with cache_partition alone: Carol {partitioned.victim.status}; at intake: {marked[0].detail}")
assert marked and "exceeds the maximum" in marked[0].detail and partitioned.victim.status == 200

# %% [markdown]
# One row needs a second look. With `cache_partition` alone (notebook 10) Dave reads nothing of Carol's,
# but not because the race closed: cut for the two tenants, Carol's share of the prefill pool is smaller
# than her prompt, so intake marks her for abort, and with `reject_check` off this is notebook 05's bug
# again: she is admitted anyway on a one-token placeholder, her transfer is too small to time out, and the
# race never starts. `deferred_release` is what closes it.

# %% [markdown]
# What `reject_check` changes, in the pools. The prefill gate retires Bob's request in the same step it
# is marked for abort; the decode node, which had opened his bootstrap room, aborts it before reserving a
# single page. The map below is the moment the decode node answers him 400: Alice's stale pages sit
# untouched in her faded colour, nothing is reserved for Bob, and no page is marked red.

# %%
fixed = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["reject_check"]), secret=SECRETS["over-length"])
log = fixed.cluster.log
retired = find_event(log, "finish", request_id="bob-1", node="decode")
print(log.events[retired])
assert not [e for e in log.for_request("bob-1") if e.kind == "allocate"]  # not one page, on either node
assert fixed.cluster.decode_audit.violations == 0 and not log.of_kind("cross_read")
page_map(log, {"prefill": 42, "decode": 125}, at=retired, page_size=16)

# %% [markdown]
# How to read it:
# - `reject_check` answers Bob **400** with the reason: the bug is gone, not just detected.
# - `kv_checksum` and `kv_canary` answer **500**: decode notices that the KV it is about to read never arrived
#   (one token sent where 800 were expected; the poison still sitting in most of Bob's pages). They are smoke
#   detectors: they stop the leak and fail loudly, whatever the cause.
# - `startup_check` refuses to start the mismatched cluster at all (below, with what its message says).
#
# The two detectors do not catch the same things. The canary works page by page, so it finds a prompt page the
# transfer never wrote, not stale slots inside a page it did write. When an over-length prompt fits in the one
# page that is sent (a prefill pool of one page), that page arrives whole, no poison survives, and `kv_canary`
# alone lets the leak through; `kv_checksum` still catches it by the token count (`tests/test_kv_checks.py`
# pins both cases). Here is `startup_check`'s refusal, and the run once the window is lowered as it says:

# %%
refused = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["startup_check"]))
print(refused.refused)
lowered = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["startup_check"]),
                       secret=SECRETS["over-length"], config=ClusterConfig(context_len=672))
print("with context_len=672:", lowered.attacker.status, lowered.attacker.error)
assert lowered.attacker.status == 400 and SECRETS["over-length"] not in lowered.attacker.text

# %% [markdown]
# This is the maintainers' second recommendation, after upgrading: after any change of weights,
# quantization, parallelism or memory fraction, read the KV pool size that **each** prefill and decode
# node logs at startup, and if it is smaller than the context length, lower the context length.

# %%
for line in Cluster(model, tok, ClusterConfig(), SafetySwitches.preset("safe").with_switches(disable=["startup_check"])).startup_log():
    print(line)

# %% [markdown]
# ## The operators' fix: a pool that holds the window
#
# Lowering the window is one way out; the operators took the other. After the fix, the disclosure says, the
# **prefill** pool holds about **2.04 million** tokens, roughly twice the 1,048,576-token context. Scaled by
# 1/1024 that is about 1,992 tokens: 125 pages of 16, **2,000 tokens**. (The decode pool's size was not
# disclosed; ours, 2,000 tokens, is our own choice.) With the safe preset, `startup_check` included, the
# cluster now starts, and Bob's 800-token prompt is simply read and answered: his own answer, not Alice's.

# %%
post_fix = ClusterConfig(prefill_pages=POST_FIX_PREFILL_PAGES)
served = run_scenario("over-length", model, tok, SafetySwitches.preset("safe"), secret=SECRETS["over-length"], config=post_fix)
bob_prompt = long_document_prompt("bob", BOB_PROMPT_CHARS, random.Random(0))  # the scenario's prompt (seed 0)
print(f"prefill pool {post_fix.prefill_tokens} tokens, decode pool {post_fix.decode_tokens}, window {post_fix.context_len}")
print("bob:", served.attacker.status, f"prompt_tokens={served.attacker.usage.prompt_tokens}", repr(served.attacker.text))
assert served.refused is None and served.attacker.status == 200
assert served.attacker.text == expected_reply(bob_prompt) and served.cross_tenant_reads == 0

# %% [markdown]
# ## Scrubbing hides the symptom
#
# `scrub_on_free` zeroes every page when it is freed. Bob no longer reads Alice's card number, but nothing
# else changed: the rejected request is still admitted, still answered **200**, with `prompt_tokens` of 800,
# and a reply computed over zeros. The bug is intact; only the evidence is gone.
#
# The audit says the same. A scrubbed slot was written by nobody, so the matrix's cross-tenant reads drop
# to 0; but the audit still catches Bob reading memory he never wrote, at every decode step. (The audit
# counts one event per decode step and per writer read: a reply that runs on for 64 tokens over zeros
# yields more events than the vulnerable reply, which copies Alice's note and stops.)

# %%
scrubbed = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["scrub_on_free"]),
                        secret=SECRETS["over-length"])
audit = scrubbed.cluster.decode_audit
print(scrubbed.attacker.status, scrubbed.attacker.usage.prompt_tokens, repr(scrubbed.attacker.text))
print(f"cross-tenant reads {audit.cross_tenant_reads}; reads of memory nobody wrote {audit.violations}, "
      f"over {scrubbed.attacker.usage.completion_tokens} generated tokens")
assert scrubbed.attacker.status == 200 and scrubbed.attacker.usage.prompt_tokens == BOB_PROMPT_CHARS
assert SECRETS["over-length"] not in scrubbed.attacker.text
assert audit.cross_tenant_reads == 0 and audit.violations > 0 and all(e.victim is None for e in audit.events)

# %% [markdown]
# ## What each switch costs
#
# Serve the same ordinary traffic (no over-length prompts, no aborts) with the vulnerable preset plus one
# switch, and compare with the vulnerable preset alone. A laptop is rarely idle, so the cell measures in
# **pairs**: the vulnerable preset and one switch run back to back (in an order that alternates), and the
# switch's time is divided by the vulnerable time *of its own pair*. Five rounds give five ratios per switch;
# their **median** (the middle one) is the cost. The clock is the wall clock (`time.perf_counter`), and the
# engine runs on one torch thread, as in notebook 09 and the benchmark: other programs then delay a step
# rather than stall a team of threads, and a pair shares what they take.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times: they depend on the machine and its load)
prompts = [note_prompt(t, Note("pin", f"{i:04d}")) for i, t in enumerate(["alice", "bob", "carol", "dave"] * 2)]
roomy = ClusterConfig(prefill_pages=128, decode_pages=256, event_log=False, audit=False)
switched = {name: vulnerable.with_switches(enable=[name]) for name in SafetySwitches.names()}

def serve_time(switches):
    cluster = Cluster(model, tok, roomy, switches)
    start = time.perf_counter()
    out = cluster.generate(prompts, max_tokens=24)
    elapsed = time.perf_counter() - start
    assert all(r.status == 200 for r in out)
    return elapsed

def pair_ratio(switches, switch_first):
    if switch_first:
        with_it = serve_time(switches)
        return with_it / serve_time(vulnerable)
    without = serve_time(vulnerable)
    return serve_time(switches) / without

threads = torch.get_num_threads()
torch.set_num_threads(1)  # one engine thread while timing, restored below
serve_time(vulnerable)  # warm-up, not counted
ratios = {name: [] for name in switched}
for r in range(5):
    for i, (name, switches) in enumerate(switched.items()):
        ratios[name].append(pair_ratio(switches, switch_first=(r + i) % 2 == 1))  # interleaved
torch.set_num_threads(threads)
ratios = {name: sorted(r) for name, r in ratios.items()}
costs = {name: statistics.median(r) for name, r in ratios.items()}
for name, ratio in costs.items():
    low, high = ratios[name][0], ratios[name][-1]
    print(f"{name:20s} {ratio:5.2f}x the vulnerable preset's time (pairs {low:.2f} to {high:.2f})")
print(f"all pairs: {min(r[0] for r in ratios.values()):.2f}x to {max(r[-1] for r in ratios.values()):.2f}x")
assert all(0.5 < ratio < 2 for ratio in costs.values()), costs  # what holds under load: no median near 2x

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times)
fig, ax = plt.subplots(figsize=(6.5, 3))
spread = [[costs[n] - ratios[n][0] for n in costs], [ratios[n][-1] - costs[n] for n in costs]]
ax.barh(list(costs), list(costs.values()), xerr=spread, color="#999999", ecolor="black", capsize=3)
ax.axvline(1.0, color="black", lw=0.8)
ax.set_xlim(0, max(2.0, 1.05 * max(r[-1] for r in ratios.values())))
ax.set_xlabel("wall time with the switch / without it  (above 1: slower)")
ax.set_title("Cost of each switch on ordinary traffic (median of 5 pairs; whiskers: all pairs)", fontsize=10)
plt.tight_layout(); plt.show()

# %% [markdown]
# What holds on a busy laptop, and all the cell asserts: no switch's median comes near doubling the time of
# ordinary traffic. On a 2-core machine with both cores busy (two other programs spinning, load 5 to 14), two
# runs gave medians of 0.91x to 1.15x and single pairs of 0.73x to 1.47x; so differences of a few percent
# between switches are noise here, and do not rank them from this plot. Where each cost lands is the lesson.
# `reject_check` and `startup_check` add no work on the normal path. `kv_checksum` reads every transferred
# byte twice.
# `kv_canary` writes every reserved page once more. `transfer_batch_cap` adds one wire latency per batch.
# `scrub_on_free` writes every freed page, which on a real GPU competes with the model for memory bandwidth,
# and is why engines do not do it.
#
# The benchmark measures the same costs on 32 requests, 5 interleaved repeats, next to `transformers`'
# own generation. This is the figure committed beside the README, from the machine that measured it
# (`python -m minikv bench --plot docs/bench.png`, about a minute and a half on an idle 2-core machine; the
# README's table comes from the same run). Its right panel reads like the plot above, as a cost: time
# relative to the vulnerable pair, above 1 slower. Its left panel is throughput, higher is better.

# %%
from IPython.display import Image

from minikv.model.checkpoint import REPO_ROOT

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
# **2.** `kv_canary` poisons every page decode reserves; the transfer must overwrite the poison before decode
# reads. Write `poisoned_pages(prompt_tokens, page_size, tokens_transferred)`: how many of the prompt's pages
# still hold the poison when only `tokens_transferred` tokens of KV arrived (a transfer writes whole pages)?
# The checker tries it on twelve transfers; then compare with the error `kv_canary` gives Bob.

# %%
def poisoned_pages(prompt_tokens, page_size, tokens_transferred):
    raise NotImplementedError  # your code here

try_exercise(check_poisoned_pages, poisoned_pages)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: every prompt page except those the transfer overwrote still holds the canary.
def poisoned_pages(prompt_tokens, page_size, tokens_transferred):
    return -(-prompt_tokens // page_size) - -(-tokens_transferred // page_size)

check_poisoned_pages(poisoned_pages)

# %% [markdown]
# Against the engine: Bob's prompt, pages of 16, one token transferred.

# %%
canary = run_scenario("over-length", model, tok, vulnerable.with_switches(enable=["kv_canary"]))
print(canary.attacker.error)
assert f"intact in {poisoned_pages(BOB_PROMPT_CHARS, 16, 1)} of" in canary.attacker.error

# %% [markdown]
# **3.** Which switches would you ship, and which would you leave off? Defend the choice with the matrix and the
# costs above. (The maintainers shipped the queue check; recommended the KV checksum and a KV canary, deferred
# release and the batch cap; and left a startup refusal as an open proposal. Their public code has no canary:
# `kv_canary` is this project's own design of one.)

# %% [markdown]
# **4.** `kv_checksum` sums every transferred byte with Adler-32 on both sides (the sum SGLang's checksum
# flag uses; its definition is in RFC 1950). Write `adler32(data)` from that definition: `A` starts at 1 and
# adds each byte, `B` starts at 0 and adds each new `A`, both modulo 65521, and the checksum is
# `B * 65536 + A`. The checker compares it with `zlib.adler32`, which `minikv/disagg/checksum.py` runs over the
# pages, and makes `zlib.adler32` raise while yours runs. Why does the sum need `B` at all? (Hint: swap two
# bytes.)

# %%
def adler32(data):
    raise NotImplementedError  # your code here

try_exercise(check_adler32, adler32)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: the definition, one byte at a time. B weights each byte by its distance from the end, so two
# swapped bytes change B where they leave A (a plain sum) unchanged.
def adler32(data):
    a, b = 1, 0
    for byte in data:
        a = (a + byte) % 65521
        b = (b + a) % 65521
    return b * 65536 + a

check_adler32(adler32)
