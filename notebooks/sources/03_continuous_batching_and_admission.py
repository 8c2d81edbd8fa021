# %% [markdown]
# # 03 · Continuous batching and admission control
#
# **The code it teaches:** `minikv/engine/scheduler.py` (who runs each step), `minikv/engine/front_door.py` (admission control: the 400s) and `minikv/engine/engine.py` (one node, step by step).
#
# **What you will learn**
# - how an engine serves many requests at once by changing its batch at every step: newcomers join
#   as soon as there are pages for them, finished requests leave and give their pages back;
# - how to read the engine's step-wise API (`submit`, `step`) and its event log, and to draw a run
#   as a timeline;
# - what **admission control** does with a request that can *never* fit (an HTTP 400 that names both
#   numbers) and with one that only has to *wait* (it queues, or is preempted and recomputed, and
#   its answer is the same word for word);
# - that the incident's configuration, scaled by **1/1024** and served on a **single node**, refuses
#   the over-long prompt exactly as intended: the behaviour the disaggregated path of notebooks
#   04–05 will lose.

# %%
import itertools
import json
import random

from minikv.model.checkpoint import load_model
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.exercises import try_exercise
from minikv.exercises.nb03_admission import check_admission, check_safe_context_len
from minikv.engine.request import Request
from minikv.viz import PageStatus, page_map, replay, timeline
from minikv.attacks.workload import Note, long_document_prompt, note_prompt

model, tok = load_model()  # CUDA when present, else the CPU


# %% [markdown]
# ## A batch that changes every step
#
# Five requests arrive over the first few steps at an engine that runs at most three at once. Each
# step is either a **prefill** (newcomers' prompts, all in one forward) or a **decode** (one more
# token for every running request); a finished request leaves at the end of its step.

# %%
def ask(tenant, field, value):
    return Request(note_prompt(tenant, Note(field, value)), tenant, max_tokens=48, request_id=f"{tenant}-1")

arrivals = {
    0: [ask("alice", "pin", "0912"), ask("bob", "card", "4929 1234 5678 9012")],
    2: [ask("carol", "key", "sk-7Hq2Zp9Xw4")],
    3: [ask("dave", "name", "Ada Lovelace"), ask("erin", "todo", "pay the rent")],
}
engine = Engine(model, tok, EngineConfig(num_pages=32, max_batch_size=3))
print("\n".join(engine.startup_log()))


# %% [markdown]
# Drive it by hand: submit what arrives, take one step, look at the batch. The table prints a row
# only when the batch changes (the quiet decode steps in between are counted).

# %%
def ran_in(engine, step):
    """(phase, request ids) of the forward at `step`, read from the event log."""
    writes = [e for e in engine.log.of_kind("write") if e.step == step]
    return (writes[0].detail.split(":")[0] if writes else "idle"), [e.request_id for e in writes]

print("step  phase    batch                        waiting          finished")
quiet, answers = 0, {}  # each response is handed over once, by the step that finished it
for step in itertools.count():
    for request in arrivals.get(step, []):
        engine.submit(request)
    if step > max(arrivals) and not engine.has_work():
        break
    done = engine.step()
    answers.update((r.request_id, r) for r in done)
    finished = [r.request_id for r in done]
    phase, batch = ran_in(engine, step)
    if phase == "decode" and not finished:
        quiet += 1
        continue
    if quiet:
        print(f"      ... {quiet} decode step{'s' if quiet > 1 else ''}")
        quiet = 0
    waiting = [s.request_id for s in engine.scheduler.waiting]
    print(f"{step:4d}  {phase:8s} {', '.join(batch):28s} {', '.join(waiting) or '-':16s} {', '.join(finished) or '-'}")
assert all(r.status == 200 for r in answers.values()) and len(answers) == 5

# %% [markdown]
# Three things to notice. The batch never holds more than three requests (`max_batch_size`): dave
# and erin wait until someone leaves. A prefill step runs only the newcomers; the others pause for
# that one step (real engines often mix both in one forward, "chunked prefill"). And every answer is
# what the request asked for:

# %%
for r in answers.values():
    print(f"{r.request_id:8s} {r.status} {r.text!r}")
assert answers["alice-1"].text == "saved pin 0912."
assert engine.audit.violations == 0 and engine.pool.num_free_pages == 32

# %% [markdown]
# The same run as a picture: one row per request, light while it waits for a place in the batch,
# dark while it holds pages and runs, a dot where it finished.

# %%
picture = timeline(engine.log, title="Continuous batching, at most 3 requests at once")
assert picture.text.endswith("5 finished")
picture

# %% [markdown]
# ## A request that can never fit
#
# Admission control runs when a request arrives, before it may hold a single page
# (`minikv/engine/front_door.py`). The context window counts the prompt *and* the output, so three rules
# decide, in this order:
#
# 1. the prompt leaves room for at least one new token: prompt ≤ window − 1;
# 2. the prompt and all the tokens it may generate fit the window: prompt + `max_tokens` ≤ window;
# 3. prompt + `max_tokens`, rounded up to whole pages, fits the **whole pool**: otherwise no amount
#    of waiting would ever make room for it.
#
# A request that breaks one comes back at once as HTTP 400, with a message that names the numbers.
# A 1,024-token prompt in a 1,024-token window breaks rule 1 even with `max_tokens=1`; 1,100 tokens
# break it too; 300 tokens with `max_tokens=48` on a 256-token pool break rule 3:

# %%
small = Engine(model, tok, EngineConfig(num_pages=16), node="small")  # 16 x 16 = 256 tokens
no_room = small.submit(Request(long_document_prompt("carol", 1024, random.Random(1)), "carol", 1, request_id="carol-0"))
too_long = small.submit(Request(long_document_prompt("carol", 1100, random.Random(1)), "carol", request_id="carol-1"))
too_big = small.submit(Request(long_document_prompt("carol", 300, random.Random(1)), "carol", 48, request_id="carol-2"))
refused = {r.request_id: r for r in small.run()}
for rid in (no_room, too_long, too_big):
    print(rid, refused[rid].status, refused[rid].error)
assert refused[no_room].status == refused[too_long].status == refused[too_big].status == 400
assert "1024 tokens; the context window is 1024" in refused[no_room].error
assert "1100 tokens" in refused[too_long].error and "1024 tokens" in refused[too_long].error
assert "352 tokens" in refused[too_big].error and "256 tokens" in refused[too_big].error

# %% [markdown]
# The second one: 300 prompt tokens plus `max_tokens=48` is 348 tokens, which takes 22 whole pages,
# 352 slots, against a pool of 256. In the event log each refusal is a single `reject`: no
# request was ever queued, and no page was allocated.

# %%
for e in small.log.events:
    print(e)
assert [e.kind for e in small.log.events] == ["reject"] * 3 and small.pool.num_free_pages == 16

# %% [markdown]
# ## A request that only has to wait
#
# A pool that is only *temporarily* full is different: the request is admitted and queues until
# pages come back. And when a running request needs one more page and none is free, the scheduler
# **preempts** the most recently admitted other request: it gives all its pages back, goes to the
# front of the waiting queue, and is recomputed from its prompt and the tokens it already produced.
# Three requests on a pool of only 6 pages (96 tokens):

# %%
trio = [ask("alice", "pin", "0912"), ask("bob", "card", "4929 1234 5678 9012"), ask("carol", "key", "sk-7Hq2Zp9Xw4")]
tight = Engine(model, tok, EngineConfig(num_pages=6, prefix_caching=False))  # no prefix cache: see notebook 09
for request in trio:
    tight.submit(request)
tight_answers = {r.request_id: r for r in tight.run()}
for e in tight.log.of_kind("preempt"):
    print(e)
assert tight.log.of_kind("preempt") and tight.pool.num_free_pages == 6

# %% [markdown]
# The preempted request's history, from the event log: pages taken, pages returned, the same request
# admitted again later with pages for everything it had, and finished.

# %%
victim = tight.log.of_kind("preempt")[0].request_id
for e in tight.log.for_request(victim):
    if e.kind in ("submit", "allocate", "preempt", "free", "finish"):
        print(e)
assert [e.kind for e in tight.log.for_request(victim)].count("preempt") >= 1

# %% [markdown]
# Waiting and recomputing cost time, never correctness: with greedy decoding the tight engine's
# answers are identical, word for word, to those of an engine with a roomy pool.

# %%
roomy = Engine(model, tok, EngineConfig(num_pages=64))
for request in trio:
    roomy.submit(request)
roomy_answers = {r.request_id: r for r in roomy.run()}
for r in trio:
    got, want = tight_answers[r.request_id], roomy_answers[r.request_id]
    print(f"{r.request_id:8s} {got.status} {got.text!r}")
    assert got.status == want.status == 200 and got.text == want.text
assert not roomy.log.of_kind("preempt") and tight.audit.violations == 0

# %%
timeline(tight.log, mark=[victim], title="6 pages for 3 requests: waiting, preempted, recomputed")

# %% [markdown]
# ## The incident's configuration, on a single node
#
# The incident's service advertised a context window of **1,048,576** tokens while its prefill pool
# held **681,280** tokens. Scaled by **1/1024**: a window of 1,024 tokens and a pool of about 665
# tokens, which in whole pages of 16 is 42 pages, **672 tokens**. Start one node like that. Its
# startup log says the problem out loud: the pool is smaller than the window. After upgrading the
# engine, the maintainers' next recommendation was to read exactly this line on every node
# (`docs/incident.md` lists them in order).

# %%
incident = Engine(model, tok, EngineConfig(num_pages=42, page_size=16, context_len=1024), node="single")
print("\n".join(incident.startup_log()))
assert incident.pool.capacity_tokens == 42 * 16 == 672 < incident.config.context_len == 1024

# %% [markdown]
# Alice saves a card number and finishes; her pages go back to the free list with her data in them.

# %%
incident.submit(Request(note_prompt("alice", Note("card", "4929 1234 5678 9012")), "alice", 48, request_id="alice-1"))
[alice] = incident.run()
print(alice.status, repr(alice.text))
assert alice.text == "saved card 4929 1234 5678 9012."

# %% [markdown]
# Then Bob sends an 800-token document (819,200 tokens at full scale): inside the advertised window,
# larger than the pool. On a single node, the pool check and the request meet in one place:

# %%
bob_prompt = long_document_prompt("bob", 800, random.Random(0))
incident.submit(Request(bob_prompt, "bob", max_tokens=48, request_id="bob-1"))
[bob] = incident.run()
print(json.dumps(bob.to_json(), indent=1))
assert bob.status == 400 and bob.usage.prompt_tokens == 800 and bob.text == ""
assert bob.error == "request needs 848 tokens of KV cache; the single node's pool holds at most 672 tokens"

# %% [markdown]
# The intended behaviour: a 400 that names both numbers (800 + 48 = 848 tokens needed, 672 held),
# nothing generated, not one page allocated to Bob, and Alice's stale pages untouched.

# %%
alice_pages = sorted(p for e in incident.log.for_request("alice-1") if e.kind == "free" for p in e.pages)
assert not [e for e in incident.log.for_request("bob-1") if e.kind == "allocate"]
assert replay(incident.log, 42)["single"].pages(PageStatus.STALE) == alice_pages and incident.audit.violations == 0
page_map(incident.log, incident.pool.num_pages, page_size=16)


# %% [markdown]
# The disclosure says it too: single-node deployments of the same engine returned the intended error.
# Notebook 04 splits the work between a prefill node and a decode node, each with its own pool; in
# notebook 05 the same request, through the same kind of checks, comes back **200**, with
# `prompt_tokens` equal to 800 and a fluent reply built from Alice's pages.
#
# ## Exercises
#
# **1.** Write `admits(prompt_len, max_tokens, context_len, pool_pages, page_size)`: does a
# single-node engine admit this request? The three rules above are all it takes. The checker compares
# it with the engine's own checks on 17 requests, the incident's included.

# %%
def admits(prompt_len, max_tokens, context_len, pool_pages, page_size):
    raise NotImplementedError  # your code here

try_exercise(check_admission, admits)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def admits(prompt_len, max_tokens, context_len, pool_pages, page_size):
    total = prompt_len + max_tokens
    in_window = prompt_len <= context_len - 1 and total <= context_len
    pages = -(-total // page_size)  # whole pages, rounded up
    return in_window and pages <= pool_pages

check_admission(admits)


# %% [markdown]
# **2.** The operator's fix. Write `safe_context_len(pool_pages, page_size, context_len)`: the
# largest context window, no larger than the configured one, for which *every* request the window
# admits also fits the pool. (For the incident's node, scaled: 42 pages of 16 and a window of 1,024.)

# %%
def safe_context_len(pool_pages, page_size, context_len):
    raise NotImplementedError  # your code here

try_exercise(check_safe_context_len, safe_context_len)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def safe_context_len(pool_pages, page_size, context_len):
    return min(context_len, pool_pages * page_size)  # lower the window to the pool, never raise it

check_safe_context_len(safe_context_len)

# %% [markdown]
# **3.** (Open.) Preemption here throws a request's pages away and recomputes them. What would it
# take to *swap* them to CPU memory instead, and when would that be cheaper than recomputing?
#
# Next: **04 · disaggregated prefill/decode**.
