# %% [markdown]
# # 09 · Shared prefixes: the cache that tenants share on purpose
#
# **The code it teaches:** `minikv/engine/prefix_cache.py` (keys chained over the prefix, parked pages, the salt), `minikv/attacks/cached_tokens.py` and `minikv/attacks/timing.py` (a secret read back from the cache).
#
# **What you will learn**
# - why serving engines reuse K/V across requests (vLLM's automatic prefix caching, SGLang's
#   RadixAttention, nano-vllm's block manager);
# - how: full pages named by a hash **chained** over the whole prefix, ref counts, and cached pages that
#   stay matchable after their request ends;
# - the side channel: a hit is reported (`usage.cached_tokens`) and is faster, so another tenant can
#   recover your prompt **character by character**;
# - the fix, `cache_salt`, and what it costs. What the salt leaves open is notebook 10.
#
# Notebooks 02 to 08 are about KV that leaks by *mistake*. Here tenants' KV meets *by design*: Bob may
# read pages Alice's request computed, because he sent the same tokens. What leaks is the *fact* that
# Alice sent them.

# %%
import random
import statistics

import matplotlib.pyplot as plt
import torch
from scipy.stats import ks_2samp

from minikv.attacks.cached_tokens import (KNOWN_PREFIX, cached_tokens_oracle, page_guesses, recover_secret,
                                        timing_audit, victim_prompt)
from minikv.attacks.scenarios import run_scenario
from minikv.attacks.timing import DIGITS, TimingLedger, timing_attack
from minikv.bench.prefix import serve, shared_prefix_workload
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.prefix_cache import page_keys
from minikv.engine.request import Request
from minikv.exercises import try_exercise
from minikv.exercises.nb09_shared_prefixes import check_cached_tokens, check_recover
from minikv.model.checkpoint import load_model
from minikv.viz import find_event, page_map

torch.manual_seed(0)
model, tok = load_model()

# %% [markdown]
# ## Why engines share
#
# Many requests start the same way: an application's system prompt, a document under discussion.
# Computing that start again for every request is waste. Below, 12 requests from 4
# tenants behind 2 system prompts of about 700 characters, served with prefix caching off, then on
# (the engine's default).

# %%
workload = shared_prefix_workload(12)
print(f"{len(workload)} requests, {len({r.tenant for r in workload})} tenants; first prompt starts "
      f"{workload[0].prompt[:60]!r}...")
off = serve(model, tok, workload, "off")
shared = serve(model, tok, workload, "shared")
assert shared.texts == off.texts  # the same answers, token for token
print(f"prompt tokens: {shared.prompt_tokens:,}; served from the cache: {shared.cached_tokens:,} "
      f"({shared.cached_tokens / shared.prompt_tokens:.0%}); the answers are identical")
assert shared.cached_tokens > 0.6 * shared.prompt_tokens
computed = {run: r.prompt_tokens - r.cached_tokens for run, r in (("off", off), ("on", shared))}
print(f"prompt tokens prefilled: {computed['off']:,} with caching off, {computed['on']:,} with it on")

# %% [markdown]
# How much faster the run gets depends on how much of its time is prefill: `python -m minikv bench`
# times 32 such requests in interleaved repeats, 3x to 4x on a 2-core CPU (docs/benchmarks.md).
#
# ## How: a hash chain over full pages
#
# A page is cached only when it is **full**. Its key is a hash of the previous page's key and its own
# tokens, so one key stands for the *whole* prefix up to the end of its page: two requests share page *i*
# only if they agree on every token before it. The keys of two prompts at 4-token pages:

# %%
a, b = "alice: save pin 0912.\n", "alice: save pin 4455.\n"
ka, kb = page_keys(tok.encode(a, add_special_tokens=False), 4), page_keys(tok.encode(b, add_special_tokens=False), 4)
for i, (x, y) in enumerate(zip(ka, kb)):
    print(f"page {i}: {a[4 * i: 4 * i + 4]!r:8} {x.hex()[:8]}  {b[4 * i: 4 * i + 4]!r:8} {y.hex()[:8]}  "
          f"{'same' if x == y else 'different'}")
assert ka[:4] == kb[:4] and ka[4] != kb[4] and len(ka) == 5  # 22 characters: 5 full pages, the last partial

# %% [markdown]
# The pool keeps a **ref count** per page: how many live requests hold it. A request that hits takes a
# reference on each matching page and prefills only the rest. Below, three requests share a 7-page stem.
# The page map shows bob-1's pages handed out (hatched) after the 7 alice-1 computed, in her colour,
# each with its ref count, 3, in the corner.

# %%
engine = Engine(model, tok, EngineConfig(num_pages=24, page_size=4, cache_salt=False))
stem = "alice: read the report. save "
engine.submit(Request(stem + "pin 0912.\n", "alice", 8, request_id="alice-1"))
engine.step()  # alice's prefill: her full prompt pages become matchable
engine.submit(Request(stem + "card 4111 2222.\n", "alice", 8, request_id="alice-2"))
engine.submit(Request(stem + "key sk-77.\n", "bob", 8, request_id="bob-1"))
engine.step()
for e in engine.log.of_kind("cache_hit"):
    print(e)
shared_pages = engine.seqs["bob-1"].block_table[:7]
print("ref counts of bob-1's first pages:", [engine.pool.ref_count(p) for p in shared_pages])
assert [engine.pool.ref_count(p) for p in shared_pages] == [3] * 7
page_map(engine.log, engine.pool.num_pages, at=find_event(engine.log, "allocate", request_id="bob-1"),
         request="bob-1", page_size=4)

# %% [markdown]
# When the requests finish, their cached pages are **parked**: free (ref count 0), still holding their
# K/V and key, matchable. A page without a key (a partial last page, an output page) goes back on the
# free stack (notebook 02). The pool hands out stack pages first, then evicts parked pages, least
# recently used first.

# %%
engine.run()
pool = engine.pool
print(f"free pages {pool.num_free_pages} of {pool.num_pages}: {len(pool.free_pages)} on the stack, "
      f"{pool.prefix_cache.num_parked} parked in the cache")
engine.check_integrity()
assert pool.num_free_pages == pool.num_pages and pool.prefix_cache.num_parked == len(pool.prefix_cache.key_of) == 16

# %% [markdown]
# The audit (notebook 02's ledger) accepts a read of a cached page only when both prompts agree on every
# token up to it, and counts such reads between tenants apart, as **cross-tenant cache hits**:

# %%
print(f"cross reads: {engine.audit.violations}; cache hits: {engine.audit.cache_hits}; "
      f"cross-tenant cache hits: {engine.audit.cross_tenant_cache_hits}")
assert engine.audit.violations == 0 and engine.audit.cross_tenant_cache_hits == 1  # bob read alice's pages

# %% [markdown]
# ## The side channel, step by step
#
# OpenAI-compatible APIs report `usage.prompt_tokens_details.cached_tokens` (minikv:
# `usage.cached_tokens`). Alice saves a key. **Mallory**, another tenant, knows how Alice's prompt
# begins: `alice: save key `. With 1-token pages (a cache that matches token by token) she sends one probe per character
# the secret could hold next, plus one last token (the engine always computes a prompt's last token):

# %%
SECRET = "Zq7"

def victim_server():
    """A single-node engine at 1-token pages, no salt, after alice saved her key."""
    server = Engine(model, tok, EngineConfig(num_pages=2048, page_size=1, cache_salt=False))
    server.submit(Request(victim_prompt(SECRET), "alice", 16))
    server.run()
    return server

ask = cached_tokens_oracle(victim_server())
probes = [KNOWN_PREFIX + c + "\n" for c in "XYZ"]
for p, hit in zip(probes, ask(probes, len(KNOWN_PREFIX) + 1)):
    print(f"{p!r:24} cached_tokens reached {len(KNOWN_PREFIX) + 1}: {hit}")

# %% [markdown]
# Only `Z` reached one token further: it is the first character. She repeats with `alice: save key Z`
# and so on, until `.` hits. `recover_secret` is that loop (on a fresh engine):

# %%
recovered, sent = recover_secret(cached_tokens_oracle(victim_server()), page_size=1)
print(f"recovered {recovered!r} with {sent} probes (66 per round: 65 symbols and the full stop)")
assert recovered == SECRET

# %% [markdown]
# The same attack through the disaggregated pair's front door
# (`python -m minikv demo --scenario prefix-probe --preset vulnerable`):

# %%
probe = run_scenario("prefix-probe", model, tok, SafetySwitches.preset("vulnerable"), secret="7Hq2Zp9Xw4")
print(f"recovered {probe.recovered!r} in {probe.probes} probes; audit: {probe.cross_tenant_reads} cross-tenant "
      f"reads, {probe.cross_tenant_cache_hits} cross-tenant cache hits")
assert probe.recovered == "7Hq2Zp9Xw4" and probe.cross_tenant_reads == 0

# %% [markdown]
# **Zero cross-tenant reads**: Mallory read only tokens she sent. The secret travelled through the
# *count* of cached tokens.
#
# ### Granularity sets the price, not the outcome
#
# With larger pages a probe hits only when a *whole* page matches, so a round must guess every unknown
# character up to the next page boundary at once. A 4-digit PIN after `alice: save pin ` (16 characters):

# %%
DIGITS = "0123456789"
pin_server = lambda ps: Engine(model, tok, EngineConfig(num_pages=4096 // ps, page_size=ps, cache_salt=False))  # noqa: E731
for ps in (1, 2):
    s = pin_server(ps)
    s.submit(Request("alice: save pin 0912.\n", "alice", 8))
    s.run()
    pin, n = recover_secret(cached_tokens_oracle(s), page_size=ps, known="alice: save pin ", alphabet=DIGITS)
    print(f"page size {ps}: recovered {pin!r} with {n} probes")
    assert pin == "0912"
print(f"page size 4: one round alone is {len(page_guesses(4, DIGITS)):,} guesses (10^4 PINs, plus shorter ones)")

# %% [markdown]
# At 16-token pages this prompt's one full page is `alice: save pin `, so the PIN is never cached: luck,
# not a defence. The cost per page grows as symbols<sup>characters per page</sup>; for short secrets it
# stays payable.
#
# ### Timing alone
#
# Without `cached_tokens`, the time to first token still tells: a hit skips prefill. Gu et al. ("Auditing
# Prompt Caching in Language Model APIs", ICML 2025) found sharing across users at 7 API providers this
# way (docs/sources.md). A *hit* sample: one account sends a fresh random prompt, a second sends the
# same and times it. A *miss*: a fresh prompt nobody sent. Many of each, interleaved.
#
# They compare the two sets with a **Kolmogorov-Smirnov (KS) test**: the share of samples faster than
# each time (the curves below), and the largest gap between the two curves. Its **p-value** is the chance
# of a gap at least that large if both sets came from the same times. Below 0.001, "no difference" is
# not believable.

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)  # timing runs on one engine thread (until the salted run below): a busy laptop's
#                           other processes then delay a step; they do not stall a team of threads

def audit_p_value(cache_salt_on, samples=20):
    server = Engine(model, tok, EngineConfig(num_pages=1024, page_size=16, cache_salt=cache_salt_on,
                                             audit=False, event_log=False))
    hit, miss = timing_audit(server, random.Random(0), samples, prompt_chars=300)
    return hit, miss, ks_2samp(hit, miss).pvalue

hit, miss, p_shared = audit_p_value(False)
salted_hit, salted_miss, p_salted = audit_p_value(True)
print("without cache_salt the audit finds sharing (KS p < 0.001):", p_shared < 1e-3)
assert p_shared < 1e-3

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times and p-values: they vary from run to run)
fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.6), sharey=True)
for ax, (name, h, m, p) in zip(axes, [("shared cache", hit, miss, p_shared), ("cache_salt", salted_hit, salted_miss, p_salted)]):
    for xs, label, colour in ((h, "hit", "#cc3311"), (m, "miss", "#777777")):
        ax.step(sorted(x * 1e3 for x in xs), [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label, color=colour)
    ax.set_title(f"{name}: KS p = {p:.1g}", fontsize=10)
    ax.set_xlabel("attacker's time to first token (ms)")
axes[0].set_ylabel("share of samples this fast")
axes[0].legend()
plt.tight_layout(); plt.show()

# %% [markdown]
# Shared, the hit curve rises first: hits are faster, far beyond chance. Salted, the curves cross.
# Reading a secret character by character is harder: a 1-token hit saves one token of prefill, far
# below this machine's noise, and each guess can be timed only once (it caches itself).
#
# ### The same attack with a stopwatch only
#
# Three changes make it work here (`minikv/attacks/timing.py`). First, **a burst** per guess: 64
# probes `alice: save key <guess><x>` with 64 different last tokens `x`, prefilled in one step; on a
# hit each computes 1 token, on a miss 2. The stopwatch is the serving thread's CPU clock
# (`time.thread_time`): on a quiet machine it reads what a wall clock reads; on a busy laptop it leaves
# out the time other programs take. With the wall clock, one busy run (load 4.5) needed 86 cycles and
# 366 s for this PIN; with the CPU clock, 24 cycles and 20 s. A remote attacker pays in samples.
#
# Second, **cycles** for fresh samples. *Our model of the victim*: Alice's application re-sends its
# prompt again and again. One cycle: Mallory flushes the cache with filler longer than the pool, Alice's
# app re-sends, one burst per guess in a random order.
#
# Third, **a rank test**. Within each cycle the bursts are ranked, fastest first, so a slow cycle counts
# like any other. A guess's **rank sum** adds its ranks over the cycles: with no hit, a very low sum is
# unlikely by chance. Testing 11 guesses after every cycle gives chance many tries, so a **Bonferroni
# correction** divides the allowed false-alarm chance by the number of tests. No verdict after 48 cycles
# means *no hit*.
#
# It answers like `cached_tokens_oracle`, so `recover_secret` runs unchanged. A 2-digit PIN (11 guesses
# a round: the 10 digits and the note's `.`):

# %%
PIN = "57"
stopwatch = Engine(model, tok, EngineConfig(num_pages=1024, page_size=1, cache_salt=False, event_log=False))
ledger = TimingLedger()
timed = timing_attack(stopwatch, PIN, page_size=1, flush_tokens=1126, alphabet=DIGITS, ledger=ledger, max_cycles=48)
print(f"recovered {timed.recovered!r} from times alone")
assert timed.recovered == PIN

# %%
# NBVAL_IGNORE_OUTPUT
# (measured: it varies with the machine's load)
print(f"{timed.seconds:.1f} s, {timed.cycles} cycles for {len(PIN) + 1} rounds, {timed.probes:,} requests "
      f"({ledger.probes:,} probes in bursts of 64, {ledger.filler} filler, {ledger.warmups} warm-ups)")
first = ledger.rounds[0]
fig, ax = plt.subplots(figsize=(6.5, 2.6))
for x, (guess, times) in enumerate(first.items()):
    ax.scatter([x] * len(times), [t * 1e3 for t in times], s=14, color="#cc3311" if guess == PIN[0] else "#777777")
ax.set_xticks(range(len(first)), list(first))
ax.set_ylim(top=2 * max(statistics.median(t) for t in first.values()) * 1e3)
ax.set_xlabel("guess for the PIN's first digit (red: the right one)")
ax.set_ylabel("burst's CPU time (ms)")
ax.set_title("Round 1: each dot is one burst of 64 probes in one cycle")
plt.tight_layout(); plt.show()

# %% [markdown]
# The right digit's bursts sit lower; ranks absorb the outliers. Each character costs (symbols + 1)
# bursts per cycle, for 5 to 48 cycles. With `cache_salt` no guess is faster: nothing recovered, no
# cross-tenant hit.

# %%
salted_server = Engine(model, tok, EngineConfig(num_pages=1024, page_size=1, cache_salt=True, event_log=False))
nothing = timing_attack(salted_server, PIN, page_size=1, flush_tokens=1126, alphabet=DIGITS, max_cycles=6)
torch.set_num_threads(threads)
print(f"with cache_salt: recovered {nothing.recovered!r} after {nothing.cycles} cycles without a verdict; "
      f"cross-tenant cache hits: {salted_server.audit.cross_tenant_cache_hits}")
assert nothing.recovered == "" and salted_server.audit.cross_tenant_cache_hits == 0

# %% [markdown]
# On GPUs serving large models, Song et al. ("The Early Bird Catches the Leak", arXiv 2409.20002) and Wu
# et al. (PromptPeek, NDSS 2025) recovered prompts token by token from timing and scheduling order.
#
# ## The fix: `cache_salt`
#
# vLLM's `cache_salt` request field, TensorRT-LLM's `cache_salt_id` and SGLang's `cache_salt` all do one
# thing: mix a secret per tenant into the *first* page's hash. Every later key chains from it, so two
# tenants' keys never match. minikv's `cache_salt` switch salts every request with its tenant (plus the
# request's own `cache_salt` field, if given). Same attack, safe preset:

# %%
safe = run_scenario("prefix-probe", model, tok, SafetySwitches.preset("safe"), secret="7Hq2Zp9Xw4")
print(f"recovered {safe.recovered!r} in {safe.probes} probes; cross-tenant cache hits: {safe.cross_tenant_cache_hits}")
assert safe.recovered == "" and safe.cross_tenant_cache_hits == 0

# %% [markdown]
# What it costs: tenants share only their own pages now. On the workload of the first section:

# %%
salted = serve(model, tok, workload, "cache_salt")
assert salted.texts == off.texts
print(f"prompt tokens from the cache: shared {shared.cached_tokens / shared.prompt_tokens:.0%}, "
      f"with cache_salt {salted.cached_tokens / salted.prompt_tokens:.0%}")
assert shared.cached_tokens > salted.cached_tokens > 0

# %% [markdown]
# The more tenants share one system prompt, the more the salt costs; a tenant keeps its own hits. `python -m minikv bench` reports both speedups (docs/benchmarks.md). The salt keeps
# tenants' *keys* apart; what they still share (the pages, the free list, the engine step) is notebook 10.
#
# ## What an operator and a customer can do
#
# **Operator.** Salt by tenant by default. Validate the salt as input (vLLM's CVE-2026-105756, advisory
# GHSA-2823-qmq8-rwvj: an over-long `cache_salt` ended the engine for every user; minikv answers 400).
# Carry it through *every* layer that keys KV: in SGLang issue #37160 and LMCache issue #4825 a salt
# dropped at the boundary to an external KV store served one tenant's prefix to another.
#
# **Customer.** Send a `cache_salt` per end user if your provider takes one; put secrets after anything
# an outsider could guess.
#
# ## Exercises
#
# **1.** Write `cached_tokens(earlier, prompt, page_size)`: the earlier prompts (token id lists) have been
# served and their full pages are cached; how many of `prompt`'s tokens does the engine take from the
# cache? (Reread "How: a hash chain over full pages", and remember which token is always computed.)

# %%
def cached_tokens(earlier, prompt, page_size):
    raise NotImplementedError  # your code here

try_exercise(check_cached_tokens, cached_tokens)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: whole pages, matched from the start (the chain), never the prompt's last token.
def cached_tokens(earlier, prompt, page_size):
    limit = (len(prompt) - 1) // page_size
    best = 0
    for e in earlier:
        pages = 0
        while pages < limit and (pages + 1) * page_size <= len(e) and \
                e[: (pages + 1) * page_size] == prompt[: (pages + 1) * page_size]:
            pages += 1
        best = max(best, pages)
    return best * page_size

check_cached_tokens(cached_tokens)

# %% [markdown]
# **2.** Write the attack: `recover(cached_tokens_of, known, alphabet)` gets an oracle that returns the
# `cached_tokens` of any prompt you send (1-token pages), and returns the secret that follows `known` in the
# victim's prompt (the secret ends at a `.`).

# %%
def recover(cached_tokens_of, known, alphabet):
    raise NotImplementedError  # your code here

try_exercise(check_recover, recover)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: one round per character; the right guess is cached one token further than what you know.
def recover(cached_tokens_of, known, alphabet):
    found = ""
    while True:
        for c in alphabet + ".":
            probe = known + found + c
            if cached_tokens_of(probe + "\n") >= len(probe):
                break
        else:
            return found  # nothing hit: nothing more to learn
        if c == ".":
            return found
        found += c

check_recover(recover)

# %% [markdown]
# **3.** Rerun the probe with `run_scenario("prefix-probe", ..., SafetySwitches.preset("vulnerable"),
# secret=...)` and a secret of your own; then with `.with_switches(enable=["cache_salt"])`. From the
# terminal: `python -m minikv demo --scenario prefix-probe --preset vulnerable --secret "..."`.
