# %% [markdown]
# # 10 · What the salt leaves open: shared pages, a shared free list, a shared step
#
# **The code it teaches:** `minikv/attacks/eviction.py` (prime and probe, and its held-pages variant), `minikv/engine/partition.py` (the static partition that closes both), `minikv/attacks/token_gaps.py` (the gaps between one tenant's tokens while another's prompt is prefilled).
#
# **What you will learn**
# - *prime and probe*: with their keys salted apart, Bob still learns whether Alice's prompt hit her
#   cache, through the pages they both draw on: one eviction order, or one free list;
# - how a static partition of the pool closes both, and what it costs;
# - the channel batching opens: the gaps between Bob's tokens while Alice's prompt is prefilled, and the
#   **ROC AUC** that measures how well they tell;
# - what chunked prefill does to that channel: it narrows it, and does not close it.
#
# Notebook 09 ended with `cache_salt`: tenants' cache keys never match. Here Alice and Bob are salted
# apart throughout. Three things stay shared: the order in which parked pages are evicted, the stack of
# free pages, and the engine step.

# %%
import random
import statistics
from dataclasses import replace

import matplotlib.pyplot as plt
import torch
from scipy.stats import mannwhitneyu

from minikv.attacks.eviction import held_pages, prime_and_probe
from minikv.attacks.token_gaps import bob_gaps
from minikv.attacks.workload import filler
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.exercises import try_exercise
from minikv.exercises.nb10_salt_leaves_open import check_auc, check_bob_evicted
from minikv.model.checkpoint import load_model

torch.manual_seed(0)
model, tok = load_model()

# %% [markdown]
# ## Prime and probe: one eviction order for everyone
#
# Parked pages (cached, held by no request: notebook 09) wait in one least-recently-used list. When a
# request needs pages and the free stack is empty, the oldest parked page goes, whoever's it is.
# Processes sharing a CPU cache leak this way (*prime and probe*, Osvik, Shamir and Tromer 2006). Bob
# **primes**: seven prompts of 496 tokens, 3,472 of the pool's 4,096. Alice sends a prompt, then a
# second: the same again (a hit, no new pages) or a fresh one (a miss: 31 new pages, some of them Bob's
# oldest). Bob **probes**: he re-sends his prompts and reads his own `cached_tokens`
# (`prime_and_probe` in `minikv/attacks/eviction.py`; a fresh engine for each run).

# %%
SHARED = EngineConfig(num_pages=256, cache_salt=True, event_log=False)  # salted apart, one pool for everyone
PARTITIONED = replace(SHARED, cache_partition=True, cache_tenants=2)  # the safe preset's static partition

def readings(attack, config, **bob):
    """Bob's readings after Alice repeated her prompt and after she sent a fresh one: a fresh engine each."""
    return {kind: attack(Engine(model, tok, config), a_repeats=kind == "repeat", **bob) for kind in ("repeat", "fresh")}

lru = readings(prime_and_probe, SHARED, b_prompts=7)
print(f"one LRU: Bob reads {lru['repeat']} after Alice's repeat, {lru['fresh']} after her fresh prompt")
assert min(lru["repeat"]) > max(lru["fresh"])

# %% [markdown]
# Bob learns whether Alice had sent her prompt before, though no key of his ever matched hers. vLLM 0.32
# does the same with a `cache_salt` per tenant (notebook 12).
#
# **The fix, `cache_partition`** (in the safe preset; `minikv serve` builds its engine so): a static
# partition of the pool (`minikv/engine/partition.py`). Each of `cache_tenants` tenants has a **quota of
# `num_pages // tenants` pages**, and every page off the free stack counts against one tenant: the pages
# its requests hold and its parked pages alike. Under its quota a tenant takes pages off the stack; at its
# quota it evicts its own oldest parked page, never another's. Two tenants on 256 pages: 128 each. Bob
# primes his whole share, four prompts:

# %%
partitioned = readings(prime_and_probe, PARTITIONED, b_prompts=4)
print(f"partitioned: Bob reads {partitioned['repeat']} after Alice's repeat, {partitioned['fresh']} after her fresh one")
assert partitioned["repeat"] == partitioned["fresh"] and min(partitioned["repeat"]) > 0

# %% [markdown]
# ## Held pages: one free list for everyone
#
# Evicting only a tenant's own parked pages is not enough while the **free stack** is shared. Bob's
# second attack (`held_pages`): he primes, Alice sends her two prompts, then Bob *holds* pages: 44
# decodes at once of one-letter prompts, shorter than a page, so nothing of them is cached. Their pages
# come off the free stack first, and once it is empty they evict parked pages, Bob's oldest first. How
# many of his own pages survive tells Bob how many pages the stack had left: how many everyone else holds
# or parked. He re-sends his prompts newest first. A small pool, 64 pages of 16 tokens; salt on,
# partition off:

# %%
SMALL = EngineConfig(num_pages=64, context_len=256, cache_salt=True, event_log=False)
HOLDS = {"b_prompts": 3, "chars": 112, "holds": 44, "hold_tokens": 15}  # three prompts of 7 pages, 44 held pages

free_list = readings(held_pages, SMALL, **HOLDS)
print(f"one free list: Bob reads {free_list['repeat']} after Alice's repeat, {free_list['fresh']} after her fresh prompt")
assert free_list["repeat"] != free_list["fresh"] and sum(free_list["fresh"]) < sum(free_list["repeat"])

# %% [markdown]
# Alice's fresh prompt parked new pages where her repeat parked none, so the stack was shorter and Bob's
# holds evicted more of his own pages. The same attack on the partitioned pool (32 pages each), and once
# more with 20 holds, so that some of Bob's pages survive:

# %%
SMALL_PARTITIONED = replace(SMALL, cache_partition=True, cache_tenants=2)
quota = {holds: readings(held_pages, SMALL_PARTITIONED, **{**HOLDS, "holds": holds}) for holds in (44, 20)}
for holds, r in quota.items():
    print(f"partitioned, {holds} holds: Bob reads {r['repeat']} after Alice's repeat, {r['fresh']} after her fresh one")
    assert r["repeat"] == r["fresh"]
assert max(quota[44]["repeat"]) == 0 < max(quota[20]["repeat"])

# %% [markdown]
# Under the partition, Bob's holds come out of his own quota: what survives depends on what he sent (44
# holds leave him nothing cached, 20 leave some) and never on Alice. The picture shows Bob's readings:

# %%
fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.6), sharey=True)
for ax, (name, r) in zip(axes, (("one free list", free_list), ("partitioned, 20 holds", quota[20]))):
    for shift, (kind, colour) in zip((-0.2, 0.2), (("repeat", "#777777"), ("fresh", "#cc3311"))):
        ax.bar([i + shift for i in range(len(r[kind]))], r[kind], width=0.4, color=colour, label=f"after Alice's {kind}")
    ax.set_xticks(range(3), ["newest", "middle", "oldest"])
    ax.set_title(name, fontsize=10)
    ax.set_xlabel("Bob's prompt, re-sent")
axes[0].set_ylabel("Bob's cached_tokens")
axes[0].legend(fontsize=8)
plt.tight_layout(); plt.show()

# %% [markdown]
# **What the partition costs.** A tenant never holds more than its quota, even alone on the server: Bob,
# with Alice idle, keeps at most half the pool cached, where the shared pool keeps all seven of his
# prompts. A request
# larger than its tenant's quota is refused at the door (`minikv serve` sizes its pools so that every
# quota holds one context window). And the quota's size tells each tenant how many tenants the pool is cut
# for. `python -m minikv bench` times the switch beside the others (docs/benchmarks.md).

# %%
def parked_alone(config, prompts=7):
    """Pages Bob keeps cached after sending `prompts` prompts of 496 tokens, alone on the server."""
    engine, rng = Engine(model, tok, config), random.Random(2)
    for _ in range(prompts):
        engine.generate([filler(rng, 496)], max_tokens=1, tenant="bob")
    return engine.pool.prefix_cache.num_parked

alone = {"shared": parked_alone(SHARED), "partitioned": parked_alone(PARTITIONED)}
print(f"Bob alone keeps {alone['shared']} pages cached on the shared pool, {alone['partitioned']} on the partitioned "
      f"one (quota {PARTITIONED.num_pages // PARTITIONED.cache_tenants})")
assert alone["partitioned"] <= PARTITIONED.num_pages // 2 < 7 * 30 <= alone["shared"]  # 30 full pages a prompt

# %% [markdown]
# ## Gaps between tokens: the channel batching opens
#
# Continuous batching (notebook 03) prefills a new prompt in the same step as everyone's decode, and a
# step takes as long as its work. Bob streams a reply; eight tokens in, Alice sends a 600-token prompt. If
# it misses her cache, the step that prefills it computes 600 tokens and Bob's next token comes late; if it
# hits, the step computes one. Bob reads only the gaps between his own tokens. Nothing is shared here but
# the step, so neither salt nor partition changes it (`minikv/attacks/token_gaps.py`; 4 trials of each,
# a fresh engine each).
#
# How well a measure of Bob's gaps tells a miss from a hit is one number, the **ROC AUC**: the chance that
# a random miss's measure is larger than a random hit's (ties count half). 0.5 is a coin flip; 1.0 tells
# every time. Counting the (miss, hit) pairs where the miss is larger is the **Mann-Whitney U** statistic;
# divided by the number of pairs, it is the AUC (`auc_of` below).

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)  # timing on one engine thread: a busy laptop's other processes then delay a step;
#                           they do not stall a team of threads

def gap_trials(trials=4, **config):
    """Bob's gaps in `trials` runs where Alice's prompt hit her cache and as many where it missed."""
    rng = random.Random(1)
    runs = {"hit": [], "miss": []}
    for _ in range(trials):
        for kind in runs:
            engine = Engine(model, tok, EngineConfig(num_pages=256, event_log=False, **config))
            alice = filler(rng, 600)
            if kind == "hit":
                engine.generate([alice], max_tokens=1, tenant="alice")  # she sent it before
            runs[kind].append(bob_gaps(engine, alice))
    return runs

def auc_of(runs, measure):
    """ROC AUC of `measure` (of Bob's gaps) telling a miss from a hit: Mann-Whitney U over all pairs."""
    miss, hit = [measure(g.bob_s) for g in runs["miss"]], [measure(g.bob_s) for g in runs["hit"]]
    return mannwhitneyu(miss, hit).statistic / (len(miss) * len(hit))

def median_of(runs, kind, measure):
    return statistics.median(measure(g.bob_s) for g in runs[kind])

whole = gap_trials()
print(f"Bob's largest gap: {median_of(whole, 'hit', max) * 1e3:.0f} ms when Alice's prompt hit, "
      f"{median_of(whole, 'miss', max) * 1e3:.0f} ms when it missed (medians)")
assert median_of(whole, "miss", max) > 2 * median_of(whole, "hit", max)

# %% [markdown]
# **Chunked prefill** (`EngineConfig(chunked_prefill=True, max_prefill_tokens=64)`, or `minikv serve
# --prefill-chunk 64`) caps the prompt tokens a step prefills: Alice's 600 go in ten steps, Bob's decode
# in each. His largest gap shrinks toward his ordinary ones. But the work is the same, so the *sum* of his
# gaps still tells:

# %%
chunked = gap_trials(chunked_prefill=True, max_prefill_tokens=64)
torch.set_num_threads(threads)
print(f"chunks of 64: Bob's largest gap on a miss {median_of(chunked, 'miss', max) * 1e3:.0f} ms "
      f"(whole prompt: {median_of(whole, 'miss', max) * 1e3:.0f} ms)")
assert median_of(chunked, "miss", max) < median_of(whole, "miss", max) / 2
assert median_of(chunked, "miss", sum) > 1.5 * median_of(chunked, "hit", sum)

# %%
# NBVAL_IGNORE_OUTPUT
# (measured: the AUCs of four trials a side and the times vary with the machine's load)
for name, runs in (("whole prompt", whole), ("chunks of 64", chunked)):
    ttft = statistics.median(g.alice_ttft_s for g in runs["miss"]) * 1e3
    print(f"{name}: AUC of the largest gap {auc_of(runs, max):.2f}, of the sum {auc_of(runs, sum):.2f}; "
          f"Alice's time to first token on a miss {ttft:.0f} ms")
fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.6), sharey=True)
for ax, (name, runs) in zip(axes, (("whole prompt", whole), ("chunks of 64", chunked))):
    for kind, colour in (("miss", "#cc3311"), ("hit", "#777777")):
        for i, g in enumerate(runs[kind]):
            ax.plot([t * 1e3 for t in g.bob_s], color=colour, alpha=0.7, label=f"Alice's {kind}" if i == 0 else None)
    ax.set_title(name, fontsize=10)
    ax.set_xlabel("Bob's tokens after Alice's arrives")
axes[0].set_ylabel("gap before the token (ms)")
axes[0].legend()
plt.tight_layout(); plt.show()

# %% [markdown]
# Whole, a miss is one tall spike; in chunks, a run of smaller bumps: lower, but as many milliseconds in
# all. Chunking bounds how long anyone waits for one token (vLLM's V1 engine chunks by default), and Alice
# pays: her prompt takes ten steps, each carrying others' decode. It narrows the channel without closing
# it. Closing it would take steps padded to a fixed cost or tenants kept out of each other's steps; the
# engines we know do neither. `minikv probe --check token-gaps` measures what is left on a server.
#
# ## Exercises
#
# **1.** Write `bob_evicted(num_pages, tenants, bob_parked, alice_parked, holds, partitioned)`: Bob parked
# `bob_parked` pages, then Alice parked `alice_parked`, and nothing else is in the pool; now Bob's
# keyless decodes take `holds` new pages. How many of Bob's parked pages do they evict, on a shared pool
# and on one partitioned for `tenants` tenants? (Which of the arguments does the partitioned answer not
# depend on?)

# %%
def bob_evicted(num_pages, tenants, bob_parked, alice_parked, holds, partitioned):
    raise NotImplementedError  # your code here

try_exercise(check_bob_evicted, bob_evicted)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: the holds take what is free to Bob first (the stack, or his quota's room), then his oldest parked pages.
def bob_evicted(num_pages, tenants, bob_parked, alice_parked, holds, partitioned):
    if partitioned:
        free_to_bob = num_pages // tenants - bob_parked  # Alice's pages count against her quota, not his
    else:
        free_to_bob = num_pages - bob_parked - alice_parked  # the shared stack
    return min(bob_parked, max(0, holds - free_to_bob))

check_bob_evicted(bob_evicted)

# %% [markdown]
# **2.** Write `auc(miss, hit)`: the ROC AUC of two lists of measures, the chance that a random miss's
# measure is larger than a random hit's, a tie counting half.

# %%
def auc(miss, hit):
    raise NotImplementedError  # your code here

try_exercise(check_auc, auc)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: every (miss, hit) pair, 1 when the miss is larger, 1/2 on a tie.
def auc(miss, hit):
    pairs = [(m > h) + 0.5 * (m == h) for m in miss for h in hit]
    return sum(pairs) / len(pairs)

check_auc(auc)

# %% [markdown]
# **3.** In `gap_trials`, try `max_prefill_tokens=16` and `=256`. How do Bob's largest gap, the sum of his
# gaps and Alice's time to first token move? Which chunk size would you pick for a chat service, and what
# does it leave an attacker?
