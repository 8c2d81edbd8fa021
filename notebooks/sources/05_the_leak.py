# %% [markdown]
# # 05 · The leak: rejected, but admitted
#
# **The code it teaches:** `minikv/disagg/prefill_node.py` (the intake check, the placeholder, the gate), `minikv/disagg/decode_node.py` (the reservation for the original length), `minikv/engine/audit.py` (the cross-tenant read) and `minikv/attacks/scenarios.py` (Alice and Bob).
#
# **What you will learn**
# - how a prompt that the prefill node *rejects* still reaches the decode node and gets an answer;
# - why that answer is **HTTP 200**, reports the long prompt's `prompt_tokens`, reads fluently, and carries
#   *another customer's* secret;
# - how to see it: the ownership audit, the page map with Bob's block table over Alice's stale pages, and
#   the one outward tell, a time to first token far below what the prompt length needs.
#
# This is the incident whose exposure ran from 2026-08-27 to 2026-09-09 and which was disclosed on
# 2026-10-26 (the facts, and which numbers are ours: [`docs/incident.md`](../docs/incident.md)), scaled by
# **1/1024**: the service advertised a **1,048,576**-token context (here 1,024) while the prefill GPUs' KV
# pool held only **681,280** tokens (here 42 pages x 16 = 672). The decode pool's size was not disclosed;
# ours, 2,000 tokens, is our choice. Nothing below calls a special "leak" function: two
# customers send ordinary requests through the same code that serves everyone, with the safety
# switches in their *vulnerable* setting, the engine as it was before the fix.

# %%
import inspect
import random
import statistics

import torch

from minikv.model.checkpoint import load_model
from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.prefill_node import PrefillNode
from minikv.attacks.scenarios import BOB_PROMPT_CHARS, MAX_TOKENS, run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.engine.engine import Engine
from minikv.exercises import try_exercise
from minikv.exercises.nb05_the_leak import check_card_reaches_bob, check_output_test
from minikv.engine.request import Request
from minikv.viz import find_event, page_map, show_replay, ttft_plot
from minikv.attacks.workload import Note, long_document_prompt, note_prompt

torch.manual_seed(0)
model, tok = load_model()
config = ClusterConfig()
print(f"context window {config.context_len} tokens and prefill pool {config.prefill_tokens} tokens (the disclosure's, "
      f"scaled by 1/1024); decode pool {config.decode_tokens} tokens (our choice: not disclosed)")

# %% [markdown]
# ## Two customers
#
# **Alice** asks the assistant to keep her card number. Her request is prefilled, its KV cache shipped to the
# decode node, the reply generated, and her pages handed back to the free list, *unscrubbed*.
# Then **Bob** sends a long document, 800 tokens: more than the prefill pool (672) but inside the advertised
# window (1,024). The operators expected the engine to refuse it.

# %%
SECRET = "5412 7534 9821 0064"
vulnerable = SafetySwitches.preset("vulnerable")
result = run_scenario("over-length", model, tok, vulnerable, secret=SECRET, seed=0)
alice, bob = result.victim, result.attacker
print("alice:", alice.status, repr(alice.text))
print("bob:  ", bob.status, f"prompt_tokens={bob.usage.prompt_tokens}", repr(bob.text))
assert alice.status == 200 and SECRET in alice.text
assert bob.status == 200 and bob.usage.prompt_tokens == BOB_PROMPT_CHARS
assert SECRET in bob.text, "Bob's reply carries Alice's card number"

# %% [markdown]
# Read Bob's response as a monitor would: status **200**, `prompt_tokens` exactly his 800, a fluent reply.
# Every field a status-code check looks at says "fine". Only the *words* are wrong: they are Alice's.
#
# ## How it got through
#
# The prefill node checks the input against what its pool can hold, as the real engine does:
# `min(context_len - 1, pool tokens - 1)`. Bob's 800 tokens fail. The request is marked for abort with status
# 400 and its input is swapped for a one-token placeholder "to skip the long prefill". The event log shows it:

# %%
log = result.cluster.log
rejection = log.events[find_event(log, "reject", request_id="bob-1")]
print(rejection)
assert "marked for abort (400)" in rejection.detail and "1-token placeholder" in rejection.detail

# %% [markdown]
# But the abort was written to a *pending* field, `to_finish`, and the queue gates ask only whether the
# request has **finished**. Here is the gate, exactly as the prefill node runs it:

# %%
print(inspect.getsource(PrefillNode.gate))

# %% [markdown]
# With `reject_check` off, `rejected` is always False and `seq.finished()` reads `finish_reason`, which nobody
# set. So Bob's request walks through every stage like any other:

# %%
stages = [e.detail for e in log.for_request("bob-1") if e.kind == "stage"]
print(" -> ".join(stages))
assert [s for s in stages if s.startswith("prefill")] == ["prefill.bootstrap", "prefill.waiting", "prefill.inflight"]
assert [s for s in stages if s.startswith("decode")] == ["decode.prealloc", "decode.transfer", "decode.running"]

# %% [markdown]
# The decode node learned the prompt length from the request itself, so it **preallocated pages for all
# 800 prompt tokens plus the output**. The prefill node sized its transfer from its *own* input, the
# one-token placeholder: one page. One page arrived; the decode node marked the whole prompt as cached.

# %%
reserved = log.events[find_event(log, "allocate", request_id="bob-1", node="decode")]
landed = [e for e in log.for_request("bob-1") if e.kind == "write" and "KV transfer landed" in e.detail]
print(reserved.detail)
print(f"pages that received KV from prefill: {[list(e.pages) for e in landed]}")
assert len(reserved.pages) == -(-(BOB_PROMPT_CHARS + MAX_TOKENS) // 16) and sum(len(e.pages) for e in landed) == 1

# %% [markdown]
# ## Whose pages?
#
# Which stale pages a reservation receives is decided by the free list: a stack, most recently freed first,
# each request's pages pushed back so that the next one gets them *in the same order*. Alice finished
# last, so Bob's block table starts with Alice's pages, holding Alice's keys and values at Alice's positions.

# %%
alice_pages = list(log.events[find_event(log, "allocate", request_id="alice-1", node="decode")].pages)
bob_pages = list(reserved.pages)
print("alice's decode pages:", alice_pages)
print("bob's first pages:   ", bob_pages[: len(alice_pages)])
assert bob_pages[: len(alice_pages)] == alice_pages

# %% [markdown]
# The audit checks every attention read against a ledger of who wrote each slot. On this node it saw Bob
# read slots that Alice wrote (and slots nobody ever wrote):

# %%
audit = result.cluster.decode_audit
from_alice = [e for e in audit.events if e.victim_tenant == "alice"]
print(f"{audit.cross_tenant_reads} cross-tenant reads; first: reader={from_alice[0].reader}, "
      f"victim={from_alice[0].victim_tenant}/{from_alice[0].victim}, pages={list(from_alice[0].pages)}")
assert result.cross_tenant_reads > 0 and set(from_alice[0].pages) <= set(alice_pages)

# %% [markdown]
# The page map at Bob's first decode step: each cell is a page of a pool, coloured by owner; stale pages
# keep the faded colour of their last writer; Bob's block table is outlined and numbered from block 0; a
# **red** crossed border marks pages read across tenants.

# %%
first_cross = find_event(log, "cross_read", request_id="bob-1")
page_map(log, {"prefill": config.prefill_pages, "decode": config.decode_pages}, at=first_cross,
         request="bob-1", page_size=config.page_size)

# %% [markdown]
# Step through the whole story yourself. The player opens on the same moment, Bob's first read of
# Alice's pages; press Play, drag the slider back to Alice's request, or step with previous/next.

# %%
show_replay(log, {"prefill": config.prefill_pages, "decode": config.decode_pages}, request="bob-1",
            page_size=config.page_size, start=first_cross)

# %% [markdown]
# ## The outward tell
#
# From outside, only one thing gave it away: the reply came back faster than a prompt that size allows. A
# single node really prefills 800 tokens before it answers; the leaked reply only prefilled one. The work is
# in the event log, and does not depend on the machine:

# %%
prefilled = [e for e in log.for_request("bob-1") if e.kind == "write" and e.node == "prefill"]
print([e.detail for e in prefilled])
assert sum(len(e.pages) for e in prefilled) == 1 and "1 token(s)" in prefilled[0].detail

# %% [markdown]
# Now the time. Bob's leaked reply is compared with an **honest** prefill of the same 800 tokens: a single
# node with prefix caching off, so that it really computes every token (with caching on, a second run of the
# same prompt is served from the cache and is fast for an honest reason: notebook 09). Each round also times
# honest prompts of 100 to 600 tokens, for the picture below.
#
# One measurement on a busy laptop can be off many times over: another program takes the CPU for a moment.
# So the cell warms the node up first, plays seven interleaved rounds, and takes the **median** (the middle
# value, which a few stalled runs cannot move) of the ratios within each round. The milliseconds depend on
# your machine and its load. The assertion asks only for a median above 3x. What held on a 2-core machine
# with both cores busy: single rounds ranged from 2x to 69x, and their median was 10x; at a load of 6 to 10,
# four runs gave medians of 15x to 36x. Single rounds say little; the median is the evidence.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times: they depend on the machine and its load)
honest_node = Engine(model, tok, EngineConfig(num_pages=64, context_len=1024, prefix_caching=False))
lengths = [100, 200, 400, 600, BOB_PROMPT_CHARS]
documents = {n: long_document_prompt("bob", n, random.Random(0)) for n in lengths}  # 800: Bob's own prompt
honest_node.generate([documents[BOB_PROMPT_CHARS]], max_tokens=1)  # warm-up, not timed
leaked, honest, ratios = [], [], []
for r in range(7):
    leaked.append(run_scenario("over-length", model, tok, vulnerable, secret=SECRET, seed=0).attacker)
    honest += [honest_node.generate([documents[n]], max_tokens=1)[0] for n in lengths]
    ratios.append(honest[-1].ttft_s / leaked[-1].ttft_s)  # the same 800 tokens, the same round
slower = statistics.median(ratios)
median_ms = lambda rs: statistics.median(r.ttft_s for r in rs) * 1e3  # noqa: E731
print(f"bob's leaked reply: {median_ms(leaked):.1f} ms to the first token; the same 800 tokens really prefilled: "
      f"{median_ms(honest[len(lengths) - 1::len(lengths)]):.1f} ms (medians of 7 rounds)")
print(f"within a round the honest prefill took {slower:.0f}x longer (median; rounds from {min(ratios):.0f}x to {max(ratios):.0f}x)")
assert slower > 3

# %% [markdown]
# Each grey dot is one honest prefill on one node, one round: the time grows with the prompt, and the dashed
# line joins the median at each length (a dot far above it is a round that another program stalled). The red star is Bob's leaked reply (the round with the median time): 800 prompt tokens,
# answered in the time of a far shorter prompt.

# %%
by_length = {n: statistics.median(r.ttft_s for r in honest if r.usage.prompt_tokens == n) for n in lengths}
assert by_length[BOB_PROMPT_CHARS] > 2 * by_length[lengths[0]]  # honest prefill takes longer for a longer prompt
typical = sorted(leaked, key=lambda r: r.ttft_s)[len(leaked) // 2]
ttft_plot(honest + [typical], mark=["bob-1"], title="Time to first token against prompt length")

# %% [markdown]
# In our reproduction the tell is a factor of many times; the disclosure says only that the affected replies
# came back faster than a prompt that size allows, and did not give their times. Notebook 08 shows how a
# customer can look for it in their own gateway log.
#
# ## The same request, safely
#
# With the fixes on (and the startup refusal turned off so that the mismatched cluster starts at all), Bob
# gets the intended answer:

# %%
safe = SafetySwitches.preset("safe").with_switches(disable=["startup_check"])
fixed = run_scenario("over-length", model, tok, safe, secret=SECRET, seed=0)
print(fixed.attacker.status, fixed.attacker.error)
assert fixed.attacker.status == 400 and SECRET not in fixed.attacker.text and fixed.cross_tenant_reads == 0


# %% [markdown]
# Notebook 06 takes the fixes one at a time.
#
# ## Exercises
#
# **1.** The operators' long-context tests checked status codes. Write the test they needed:
# `trustworthy(prompt, response)` returns False for a 200 whose reply repeats a note the prompt never held.
# (Hint: `minikv.attacks.workload.expected_reply(prompt)` says what the assistant should answer.)

# %%
def trustworthy(prompt, response):
    raise NotImplementedError  # your code here

try_exercise(check_output_test, trustworthy)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: a non-200 is an honest failure; a 200 must say exactly what the prompt explains.
from minikv.attacks.workload import expected_reply

def trustworthy(prompt, response):
    if response.status != 200:
        return True
    return response.text == expected_reply(prompt)

check_output_test(trustworthy)
assert not trustworthy(long_document_prompt("bob", BOB_PROMPT_CHARS, random.Random(0)), bob)

# %% [markdown]
# **2.** Run the scenario with your own secret (letters, digits, spaces, `-` and `,`, up to 40 characters)
# with `run_scenario("over-length", model, tok, vulnerable, secret=...)`. Does Bob's reply carry it exactly?
# From the terminal: `python -m minikv demo --scenario over-length --preset vulnerable --secret "..."`.
#
# **3.** Predict, then check: Bob sends 700 tokens instead of 800, and then 1,100. For each, does the prefill
# node reject it, does the decode node reserve pages for it, and does Alice's card reach Bob? Write down your
# three answers for each, then change `800` below and run the cell. (Which check runs first, and where? Notebook
# 03 named the rules; the front door of the pair applies some of them before either node sees a request.)

# %%
def bob_sends(chars):
    """Alice, then Bob's `chars`-token document, on a fresh vulnerable pair; what happened to Bob."""
    pair = Cluster(model, tok, config, vulnerable)
    pair.submit(Request(note_prompt("alice", Note("card", SECRET)), "alice", MAX_TOKENS, request_id="alice-1"))
    pair.run()
    pair.submit(Request(long_document_prompt("bob", chars, random.Random(0)), "bob", MAX_TOKENS, request_id="bob-1"))
    [reply] = pair.run()
    seen = {(e.kind, e.node) for e in pair.log.for_request("bob-1")}
    return {"status": reply.status, "prefill rejected": ("reject", "prefill") in seen,
            "decode reserved": ("allocate", "decode") in seen, "alice's card reached bob": SECRET in reply.text}

print(bob_sends(800))  # the case above; now 700, then 1100

# %% [markdown]
# **4.** Make exercise 3 exact: write `card_reaches_bob(prompt_tokens)`, True when Alice's card comes back in
# Bob's reply on this notebook's vulnerable pair (a window of 1,024 tokens, `MAX_TOKENS` = 64, a prefill pool of
# 672 tokens). The checker runs the pair for each length it tries, so your answer is judged by the engine.

# %%
def card_reaches_bob(prompt_tokens):
    raise NotImplementedError  # your code here

try_exercise(check_card_reaches_bob, card_reaches_bob)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: the pair's front door refuses what cannot fit the window (prompt + output); the prefill node marks
# for abort what does not fit its pool with the token it makes, and that is the leak.
def card_reaches_bob(prompt_tokens):
    fits_window = prompt_tokens + 64 <= 1024
    fits_prefill_pool = prompt_tokens + 1 <= 672
    return fits_window and not fits_prefill_pool

check_card_reaches_bob(card_reaches_bob)
