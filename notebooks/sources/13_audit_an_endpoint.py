# %% [markdown]
# # 13 · Audit an endpoint you did not configure
#
# **The code it teaches:** `minikv/serve/mystery.py` (a server whose fixes are drawn from a seed and shown
# nowhere), `minikv/exercises/nb13_audit.py` (the audit's requests, and what each fix makes of them) and
# `minikv/probe/run.py` (the black-box checks of notebook 11).
#
# **What you will learn**
# - to audit an OpenAI-compatible endpoint as a customer does: two keys of your own, the official `openai`
#   client, `minikv probe`, and nothing else;
# - to read symptoms back to fixes: a 400 inside the advertised window, a 500 at one length and not another,
#   `cached_tokens` where there should be none;
# - that some fixes no outsider can observe at all, and why that is the reason to run them anyway.
#
# The server below runs `python -m minikv serve --mystery SEED`. Its nine safety switches (notebook 06's,
# the salt of notebook 09 and the partition of notebook 10) are each on or off, drawn from the seed alone.
# Everything else is fixed: the prefill/decode pair, a 1,024-token window, the incident's 672-token prefill pool (the post-fix
# 2,000 tokens where `startup_check` is on, since it would refuse the smaller one). Its startup log, `/health`
# and its error messages name no switch and no pool. `SEED = 0` keeps this notebook's run the same everywhere;
# in a workshop each laptop takes a seed of its own.

# %%
from functools import partial

import httpx
import matplotlib.pyplot as plt

from minikv.disagg.switches import SafetySwitches
from minikv.exercises import try_exercise
from minikv.exercises.nb13_audit import (EVERY_DRAW, SWITCHES, check_every_endpoint, check_predictions,
                                         score_verdicts, decided, eviction_sign, expected_evidence, explain,
                                         gather_evidence)
from minikv.model.checkpoint import load_model
from minikv.probe.run import probe_endpoint
from minikv.serve.launch import ServerThread

SEED = 0  # change it: every seed is a server of its own
KEYS = {"alice": "sk-alice-7f3a9c", "bob": "sk-bob-2e81d4"}
KEY_ARGS = [a for tenant, key in KEYS.items() for a in ("--api-key", f"{tenant}={key}")]
model, tok = load_model()
server = ServerThread(["--mystery", str(SEED), *KEY_ARGS], model, tok)
print("\n".join(server.startup_log))
assert not any(name in line for name in SWITCHES for line in server.startup_log)

# %% [markdown]
# That is all the operator's log says. The learner's view is a customer's: the address, key A
# (`sk-alice-...`) and key B (`sk-bob-...`). `/v1/models` gives the model and its window; `/health` says it
# is up, to the operator's key as to anyone (a pool's size would give `startup_check` away).

# %%
models = httpx.get(server.base_url + "/models", headers={"Authorization": f"Bearer {KEYS['bob']}"}).json()
operator = {"Authorization": f"Bearer {server.admin_key}"}
health = [httpx.get(server.url + "/health", headers=h).json() for h in ({}, operator)]
print(models["data"][0]["id"], "window:", models["data"][0]["max_model_len"], "tokens; /health:", health)
assert models["data"][0]["max_model_len"] == 1024 and health == [{"status": "ok"}] * 2

# %% [markdown]
# ## Requests of your own
#
# The probe sends many requests and judges some by time; an auditor also wants a few requests whose answer
# is plain. `gather_evidence` sends seven, on this fresh server, with the official client (read it: it is 30
# lines). The shipped model keeps notes: a prompt holding `save key X.` is answered `saved key X.` when it
# is read.
#
# 1. Key A saves a note with a random canary; key B sends an 800-token document: inside the 1,024 window,
#    past the incident's 672-token prefill pool. A 400 refused it; A's canary in the reply is the incident.
# 2. Key B sends prompts of 300 and 500 tokens holding a note of its own: B's canary back means they were
#    read.
# 3. Key A sends a 200-token prompt twice, then key B sends the same: `cached_tokens` on A's repeat shows a
#    prefix cache; on B's copy, a cache shared across keys.

# %%
evidence, transcript = gather_evidence(server.base_url, KEYS["alice"], KEYS["bob"], models["data"][0]["id"])
for who, sent, status, reply in transcript:
    print(f"key {who}: {sent[:46]:46} -> {status} {reply[:40]!r}")
assert len(transcript) == 7 and transcript[0][2] == 200

# %% [markdown]
# ## The probe
#
# Now `minikv probe` (notebook 11), with its four default checks and the eviction check. Its timings move
# with the machine's load, so read its verdicts, not its milliseconds. A check that could not finish says so
# (COULD NOT TELL): a 500 from the endpoint stops a check, and is itself evidence.

# %%
# NBVAL_IGNORE_OUTPUT
# (verdicts that rest on timing may differ on a loaded machine)
report = probe_endpoint(server.url, KEYS["alice"], KEYS["bob"], seed=0, rounds=6,
                        checks=("canary", "over-length", "honesty", "prefix-cache", "eviction"))
for result in report.results:
    print(f"{result.name:22} {result.verdict.upper():10} {result.reason[:90]}")
evidence["eviction"] = eviction_sign(report)
print(evidence)

# %%
assert [r.name for r in report.results][-1] == "shared eviction order" and set(evidence) == {
    "B 800", "B 300", "B 500", "A repeats", "B on A's prompt", "eviction"}

# %% [markdown]
# ## From symptoms to fixes
#
# | what you saw | what it says |
# | --- | --- |
# | B's 300-token prompt: 500 | a transfer of 19 pages in one batch outlasts decode's timeout: `transfer_batch_cap` off |
# | B's 800 tokens: 400 | refused past the prefill pool: `reject_check` on, and a pool smaller than the window (`startup_check` off) |
# | B's 800 tokens: 500, while 300 are served | a KV check caught KV that never arrived: `kv_checksum` or `kv_canary` on, never saying which |
# | B's 800 tokens: 200 with A's canary | nothing stopped it, and freed pages were kept: the incident |
#
# The caches, the salt and the partition (notebooks 09 and 10):
#
# | what you saw | what it says |
# | --- | --- |
# | B's 500 tokens refused or not read, 300 read | a tenant's quota of half the incident's pool: `cache_partition` on |
# | A's own repeat: `cached_tokens` 0 | every freed page zeroed, its cache entry with it: `scrub_on_free` on |
# | B reads A's prompt from the cache | neither the salt nor the partition |
# | the eviction check fails | A's requests move B's cache: `cache_partition` off |
#
# Some rows hide others. With `reject_check` on, no over-length request reaches the KV checks: whether they
# are on changes no answer. Where a verdict cannot be decided, `None` is the right answer.

# %% [markdown]
# ## Exercises
#
# **1.** Write `verdicts(evidence)`: for each of the nine switches `True` (on), `False` (off) or `None` (the
# evidence cannot tell), from the `evidence` dict above. Writing the dict out by hand is fine. The checker
# compares it with the server's real switches, fix by fix, and says what evidence shows each one.

# %%
def verdicts(evidence):
    raise NotImplementedError  # your code here: return {"reject_check": ..., ...}

try_exercise(partial(score_verdicts, seed=SEED, evidence=evidence), verdicts)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: elimination. Of the 512 servers the seed could have drawn, keep those that give this evidence
# (expected_evidence predicts it, switch by switch); a fix is decided where all of them agree.
import itertools

from minikv.disagg.switches import SafetySwitches
from minikv.exercises.nb13_audit import SWITCHES, expected_evidence

def verdicts(evidence):
    fits = [s for s in (SafetySwitches(*bits) for bits in itertools.product([False, True], repeat=9))
            if expected_evidence(s) == evidence]
    return {n: getattr(fits[0], n) if len({getattr(s, n) for s in fits}) == 1 else None for n in SWITCHES}

score_verdicts(verdicts, SEED, evidence)  # this seed's server, fix by fix
check_every_endpoint(verdicts)  # and every other server the seed could have drawn

# %% [markdown]
# ## What an outsider can see
#
# Over all 512 draws, the same audit decides `transfer_batch_cap` and `scrub_on_free` every time: each
# changes what every client gets. It decides `kv_checksum` and `kv_canary` on 28 draws: only where
# `reject_check` is off, the pool smaller than the window, and both checks off; a 500 never says which one
# caught the request. It never decides `deferred_release`: that fix acts only when a transfer is cut off
# and its pages go to another tenant at once, a race inside the provider that requests sent one after
# another never set up. On the right, this endpoint: what the evidence decided and what it could not.

# %%
share = {n: sum(decided(expected_evidence(s))[n] is not None for s in EVERY_DRAW) for n in SWITCHES}
rows = explain(SEED)
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True, gridspec_kw={"width_ratios": [3, 2]})
y = range(len(SWITCHES))[::-1]
left.barh(y, [share[n] / len(EVERY_DRAW) for n in SWITCHES], color="#4477aa")
left.set_yticks(list(y), SWITCHES); left.set_xlim(0, 1); left.set_xlabel("share of the 512 draws the audit decides")
colour = {True: "#228833", False: "#cc3311", None: "#bbbbbb"}
for yi, (name, on, decides, _) in zip(y, rows):
    right.scatter([0], [yi], s=160, color=colour[decides if decides is None else on], edgecolor="black")
    right.annotate(f"{'on' if on else 'off'}: " + ("decided" if decides is not None else "the audit could not tell"),
                   (0, yi), xytext=(14, -4), textcoords="offset points", fontsize=9)
right.set_xlim(-0.2, 1.6); right.set_xticks([]); right.set_title(f"seed {SEED}: the server's switches", fontsize=10)
left.set_title("What the audit can decide, over every draw", fontsize=10)
plt.tight_layout(); plt.show()
print({n: f"{share[n]}/512" for n in SWITCHES})
assert share["transfer_batch_cap"] == share["scrub_on_free"] == 512 and share["deferred_release"] == 0
assert share["kv_checksum"] == share["kv_canary"] == 28

# %% [markdown]
# ## Defence in depth
#
# The fixes an audit cannot see are mostly the ones standing behind another: `kv_checksum` and `kv_canary`
# behind `reject_check`, `reject_check` behind a pool that holds the window. While the first line holds, the
# second never acts, so nothing outside can tell whether it is there. It is there for the day the first line
# fails: a refactor that drops a queue gate, a pool resized by hand. A clean audit says the endpoint behaved;
# it does not say which fixes are configured. For those, ask the provider: the startup log's pools, the
# switches, the tests that show each fix catching what it is for (notebook 06).
#
# **2.** Write `predict(switches)`: the evidence a fresh mystery server with these `SafetySwitches` gives,
# as the dict `gather_evidence` builds plus `"eviction"`. Follow each request through the fixes in the order
# they act (notebooks 05 to 10). The checker tries all 512 draws against `expected_evidence`, which the
# tests hold against real servers (read it after).

# %%
def predict(switches):
    raise NotImplementedError  # your code here

try_exercise(check_predictions, predict)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: an over-length request meets reject_check, then the two KV checks, then whatever the freed pages
# hold; a long transfer needs the batch cap; a scrubbed page leaves the prefix cache.
def predict(s):
    def past_the_pool(unchecked):
        return "400" if s.reject_check else "500" if s.kv_checksum or s.kv_canary else unchecked
    served = "read" if s.transfer_batch_cap else "500"
    cache = not s.scrub_on_free
    return {"B 800": ("200" if s.transfer_batch_cap else "500") if s.startup_check
            else past_the_pool("200" if s.scrub_on_free else "leak"),
            "B 300": served,
            "B 500": past_the_pool("not read") if s.cache_partition and not s.startup_check else served,
            "A repeats": "cached" if cache else "not cached",
            "B on A's prompt": "shared" if cache and not s.cache_salt and not s.cache_partition else "own",
            "eviction": "shared" if cache and s.startup_check and s.transfer_batch_cap and not s.cache_partition
            else "no sign"}

check_predictions(predict)

# %% [markdown]
# **3.** (Open, for the workshop's last half hour.) Start `python -m minikv serve --mystery N --api-key
# a=KA --api-key b=KB` with a seed of your own, audit it from a second terminal with the probe and the
# client, and write your verdicts down. Compare them with your neighbours': where you disagree, whose
# evidence decides? Which request would you add to tell `kv_checksum` from `kv_canary`, and why can the
# API not give you one?
#
# The server stops here, as Ctrl-C stops it in a terminal.

# %%
print("exit status:", server.stop())
