# %% [markdown]
# # 02 · Page pools and block tables
#
# **The code it teaches:** `minikv/engine/page_pool.py` (pages, the free list, never zeroed), `minikv/engine/paged_step.py` (block tables and the slot mapping), `minikv/engine/audit.py` (who wrote each slot) and `minikv/bench/memory.py` (what reservations waste).
#
# **What you will learn**
# - why giving every request its own maximum-length reservation wastes most of the KV memory, measured
#   on a workload, and how that compares with the PagedAttention paper's numbers;
# - what a **page pool** is: one KV tensor cut into fixed-size pages, a **free list** that hands them
#   out, and a **block table** per request that says which pages hold its tokens, in order;
# - the **slot mapping** `page * page_size + offset`, and that attention read through a block table
#   gives exactly the answer of a contiguous cache;
# - that **freed pages are not zeroed**: a finished request's keys and values stay in the pool, and
#   the next request is handed those very pages;
# - how to watch the pool change, page by page, with a step-through widget.
#
# As in notebook 01, every token count from the real incident is scaled by **1/1024**: the advertised
# context window of 1,048,576 tokens becomes 1,024.

# %%
import itertools
import random

import matplotlib.pyplot as plt
import torch

from minikv.model.checkpoint import load_model
from minikv.engine.config import EngineConfig
from minikv.model.contiguous_cache import ContiguousCache
from minikv.engine.engine import Engine
from minikv.exercises import try_exercise
from minikv.exercises.nb02_page_pools import check_slot_mapping, check_wasted_slots
from minikv.bench.memory import contiguous_use, paged_use
from minikv.engine.page_pool import PagePool
from minikv.engine.paged_step import PagedStep, SeqSlice
from minikv.engine.request import Request
from minikv.viz import PageStatus, find_event, page_map, replay, show_replay
from minikv.exercises.nb02_page_pools import check_stale_pages
from minikv.attacks.workload import TENANTS, Note, document_sentence, make_prompt, note_prompt, random_note

torch.manual_seed(0)
model, tok = load_model()  # CUDA when present, else the CPU
cfg = model.config
print(f"K/V per token: {cfg.num_layers} layers x 2 x {cfg.num_kv_heads} KV heads x {cfg.head_dim} dims "
      f"x 4 bytes = {cfg.kv_bytes_per_token:,} bytes")

# %% [markdown]
# ## What a maximum-length reservation wastes
#
# Notebook 01's cache gives each request a row of slots as long as the longest sequence it *might*
# reach, before it has produced a single token. Most requests end far sooner. To see how much that
# costs, serve a mixed workload: 32 requests from 8 tenants, each a note to save, some after a
# document of up to 400 characters (one token per character).

# %%
rng = random.Random(0)
requests = []
for i in range(32):
    sentences = [random_note(rng).sentence]
    doc_chars = rng.choice([0, 0, 40, 120, 250, 400])
    if doc_chars:
        sentences.insert(0, document_sentence(rng, doc_chars))
    tenant = TENANTS[i % 8]
    requests.append(Request(make_prompt(tenant, sentences), tenant, max_tokens=64, request_id=f"w{i:02d}"))
print(repr(requests[0].prompt))
assert len(requests) == 32 and len({r.tenant for r in requests}) == 8

# %% [markdown]
# Run them all through an engine with a roomy pool, then count, for every request, the K/V slots it
# actually filled: its prompt plus each generated token fed back in (the last one never is).

# %%
roomy = Engine(model, tok, EngineConfig(num_pages=1024, audit=False))  # 16,384 tokens: all 32 fit at once
seqs = [roomy.seqs[roomy.submit(r)] for r in requests]  # the engine forgets a request once answered
responses = {r.request_id: r for r in roomy.run()}
kv_lens = [s.num_cached for s in seqs]
assert all(r.status == 200 for r in responses.values())
usage = [responses[s.request_id].usage for s in seqs]
assert kv_lens == [u.prompt_tokens + u.completion_tokens - 1 for u in usage]
print(f"K/V filled per request: {min(kv_lens)} to {max(kv_lens)} tokens, {sum(kv_lens):,} in all")

# %% [markdown]
# Now compare three ways of reserving memory for the same requests (`minikv.bench.memory`):
# - a row of the whole **context window**, 1,024 slots (1,048,576 / 1,024), per request;
# - a row of **prompt + max_tokens** per request: better, but the budget is rarely used up;
# - **whole pages** of 16 tokens, taken as the request grows: only the end of its last page is empty.
#
# The last line checks the paged count against what the engine really took off its free list.

# %%
page_size = roomy.pool.page_size
schemes = [
    contiguous_use(kv_lens, roomy.config.context_len, "row of the context window"),
    contiguous_use(kv_lens, [len(tok.encode(r.prompt)) + r.max_tokens for r in requests], "row of prompt + max_tokens"),
    paged_use(kv_lens, page_size, f"whole pages of {page_size} tokens"),
]
for use in schemes:
    print(use)
window, budget, paged = schemes
assert window.utilisation < min(budget.utilisation, paged.utilisation)
assert sum(len(e.pages) for e in roomy.log.of_kind("allocate")) * page_size == paged.reserved_tokens

# %% [markdown]
# The PagedAttention paper (Kwon et al., SOSP 2023) measured the same thing in real systems: earlier
# engines kept token states in only **20.4%–38.2%** of their KV memory, while vLLM wastes **under 4%**.
# Our numbers land in the same places. A page pool can waste at most one partly filled page per
# request, so its share of waste shrinks as requests grow longer than a page.

# %% jupyter={"source_hidden": true}
fig, ax = plt.subplots(figsize=(7, 2.2))
for y, use in enumerate(schemes):
    ax.barh(y, use.used_tokens, color="#0072b2", label="K/V of a token" if y == 0 else None)
    ax.barh(y, use.reserved_tokens - use.used_tokens, left=use.used_tokens, color="#cccccc",
            label="reserved, empty" if y == 0 else None)
    ax.text(use.reserved_tokens + 300, y, f"{use.utilisation:.0%} used", va="center", fontsize=9)
ax.set_yticks(range(3), [u.scheme for u in schemes]); ax.invert_yaxis()
ax.set_xlim(0, window.reserved_tokens * 1.15); ax.set_xlabel("KV slots (tokens)")
ax.set_title("The same 32 requests, three ways to reserve their KV cache", fontsize=10)
ax.legend(loc="lower right", fontsize=10); plt.tight_layout(); plt.show()
assert window.utilisation < 0.382 and paged.waste < 0.04

# %% [markdown]
# Waste is not an accounting detail: it decides how many requests run at once, and so the
# throughput. Give both schemes the same budget of 2,048 tokens (128 pages of 16). Rows of the whole
# window fit two requests; in pages, an average request of this workload fits several times over.

# %%
budget_tokens = 128 * page_size
rows_that_fit = budget_tokens // roomy.config.context_len
average_pages = paged.reserved_tokens / paged.num_requests  # slots per request, in whole pages
paged_that_fit = int(budget_tokens // average_pages)
print(f"{budget_tokens:,} tokens of KV memory: {rows_that_fit} requests as window rows, "
      f"about {paged_that_fit} average requests ({average_pages:.0f} slots each) as pages")
assert rows_that_fit == 2 and paged_that_fit > 2 * rows_that_fit

# %% [markdown]
# ## Pages and the free list
#
# A page pool is one tensor, allocated once per node, shaped
# `[layers, 2 (K and V), num_pages, page_size, kv_heads, head_dim]`, plus a list of the page numbers
# nobody holds. Here is a toy pool of 8 pages of 4 tokens.

# %%
pool = PagePool(cfg, num_pages=8, page_size=4, device=model.device)
print(tuple(pool.kv.shape), "=", pool.capacity_tokens, "token slots")
print("free list:", pool.free_pages, "(a stack: pop() takes from the right)")
assert pool.capacity_tokens == 32 and pool.free_pages == [7, 6, 5, 4, 3, 2, 1, 0]

# %% [markdown]
# `allocate` pops pages off the stack and records their owner; it is O(1) per page. A request
# never needs its pages to be next to each other.

# %%
alice_pages = pool.allocate(3, "alice-1")
bob_pages = pool.allocate(2, "bob-1")
print("alice-1:", alice_pages, " bob-1:", bob_pages, " free:", pool.free_pages)
assert (alice_pages, bob_pages) == ([0, 1, 2], [3, 4]) and pool.num_free_pages == 3

# %% [markdown]
# `free` pushes a request's pages back in reverse, so the most recently freed page is on top and the
# next request receives them **in the same order**. Remember this: it is why, in our reproduction of the
# incident (notebook 05), the stale data the new request finds is the *most recent* tenant's, neatly lined
# up. (The disclosure says only that the pages held earlier users' prompts and generations.)

# %%
pool.free(alice_pages, "alice-1")
print("after alice-1 frees:", pool.free_pages)
carol_pages = pool.allocate(3, "carol-1")
print("carol-1 gets:", carol_pages)
assert carol_pages == alice_pages  # the same pages, in the same order
pool.check_integrity()

# %% [markdown]
# ## Block tables and the slot mapping
#
# A request's **block table** lists its pages in order. Token *i* lives in page
# `block_table[i // page_size]` at offset `i % page_size`; in the pool viewed as one flat row of
# slots, that is slot `page * page_size + offset`. `pool.slots` computes it.

# %%
pool = PagePool(cfg, num_pages=8, page_size=4, device=model.device)  # a fresh pool
prompt = "alice: save pin 0912.\n"
ids = tok.encode(prompt)
block_table = [5, 2, 7, 0, 3, 6]  # pages left scattered by requests that came and went
slots = pool.slots(block_table, 0, len(ids))
print(len(ids), "tokens -> slots", slots)
assert slots[9] == block_table[9 // 4] * 4 + 9 % 4 == 29

# %% [markdown]
# The picture: the request sees its tokens as consecutive blocks (top); the pool stores them in
# whatever pages it was given (bottom), one character per slot.

# %% jupyter={"source_hidden": true}
fig, ax = plt.subplots(figsize=(9, 2.4))
visible = {"\n": "↵", " ": "·"}  # the newline and spaces, made visible
for block, page in enumerate(block_table):
    colour = plt.cm.tab10(block)
    ax.annotate("", (page * 5 + 2, 1.05), (block * 5 + 2, 2.0), arrowprops=dict(arrowstyle="->", color=colour))
    for offset in range(4):
        i = block * 4 + offset
        text = visible.get(prompt[i], prompt[i]) if i < len(ids) else ""
        for x, y in ((block * 5 + offset, 2), (page * 5 + offset, 0)):
            ax.add_patch(plt.Rectangle((x, y), 1, 1, facecolor=colour, alpha=0.35, edgecolor="grey"))
            ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=9, family="monospace")
for page in set(range(8)) - set(block_table):
    for offset in range(4):
        ax.add_patch(plt.Rectangle((page * 5 + offset, 0), 1, 1, fill=False, edgecolor="lightgrey"))
for page in range(8):
    ax.text(page * 5 + 2, -0.35, f"page {page}", ha="center", fontsize=8)
for block in range(len(block_table)):
    ax.text(block * 5 + 2, 3.25, f"block {block}", ha="center", fontsize=8)
ax.text(-0.5, 2.5, "request\n(blocks)", ha="right", va="center", fontsize=8)
ax.text(-0.5, 0.5, "pool\n(pages)", ha="right", va="center", fontsize=8)
ax.set_xlim(-4, 40); ax.set_ylim(-0.7, 3.6); ax.axis("off")
ax.set_title(f"block table {block_table}: token i goes to slot block_table[i // 4] * 4 + i % 4", fontsize=10)
plt.tight_layout(); plt.show()
assert [prompt[i] for i in range(len(ids)) if slots[i] // 4 == 7] == list("ave ")  # block 2 -> page 7

# %% [markdown]
# ## Attention through the block table
#
# The model never owns its cache: each layer hands its new keys and values to a *backend*.
# `PagedStep` scatters them into the slots of `slot_mapping`, then gathers each request's context
# back through its block table and attends over it. Run the prompt through the model twice, once
# over the scattered pages and once over notebook 01's contiguous cache.

# %%
x = torch.tensor(ids, device=model.device)
positions = torch.arange(len(ids), device=model.device)
paged_step = PagedStep(pool, [SeqSlice(uid=1, block_table=block_table, start=0, num_new=len(ids))])
row = ContiguousCache(cfg, num_rows=1, max_len=32, device=model.device)
with torch.inference_mode():
    paged_logits = model(x, positions, paged_step)  # (22, vocab)
    contiguous_logits = model(x[None], positions[None], row.step([0], len(ids)))[0]  # (22, vocab)
assert paged_step.slot_mapping.tolist() == slots
assert torch.allclose(paged_logits, contiguous_logits, atol=1e-4)
print("same logits at all", len(ids), "positions; next token:", repr(tok.decode([int(paged_logits[-1].argmax())])))

# %% [markdown]
# Same numbers, different places: the key of token 9 sits in slot 29 of the pool and at position 9
# of the contiguous row.

# %%
paged_keys, _ = pool.flat(0)  # layer 0's keys as (num_slots, KVH, D), a view of the pool
contiguous_keys = row.kv[0, 0, 0, : len(ids)]  # layer 0's keys of row 0, (T, KVH, D)
assert torch.allclose(paged_keys[slots], contiguous_keys, atol=1e-6)
print(f"token 9 ({prompt[9]!r}): slot {slots[9]} of the pool holds the key at position 9 of the row")

# %% [markdown]
# ## Freed pages keep their data
#
# Now a real engine, with a 16-page pool. Alice saves a pin. After her prefill step, copy the keys and
# values of her prompt out of the pool, so that we can compare later. (Prefix caching is off in this
# notebook, so that every freed page goes back on the stack; notebook 09 turns it on.)

# %%
engine = Engine(model, tok, EngineConfig(num_pages=16, prefix_caching=False))
engine.submit(Request("alice: save pin 0912.\n", tenant="alice", max_tokens=32, request_id="alice-1"))
engine.step()  # prefill: her prompt's K/V go into her pages
alice = engine.seqs["alice-1"]
alice_pages = list(alice.block_table)
prompt_slots = engine.pool.slots(alice_pages, 0, len(alice.prompt_ids))
k_all, v_all = engine.pool.flat_all()  # (layers, slots, KVH, D), views of the pool
k_before, v_before = k_all[:, prompt_slots].clone(), v_all[:, prompt_slots].clone()
print("alice-1 holds pages", alice_pages)
assert alice_pages == [0, 1]

# %% [markdown]
# Let her request run to the end. Its pages go back to the free list, and nothing else happens to
# them: zeroing would cost one memory write per freed page, and the next owner overwrites them anyway.

# %%
done = engine.run()
print(done[0].status, repr(done[0].text), "| free pages:", engine.pool.num_free_pages, "of 16")
alice_pages = list(engine.log.events[find_event(engine.log, "free", request_id="alice-1")].pages)
assert done[0].text == "saved pin 0912." and engine.pool.num_free_pages == 16
assert torch.equal(k_all[:, prompt_slots], k_before) and torch.equal(v_all[:, prompt_slots], v_before)
print(f"alice-1 freed pages {alice_pages}; the K/V of her {len(prompt_slots)} prompt tokens are still there, bit for bit")

# %% [markdown]
# The page map draws every page of the pool as one cell. Alice's freed pages are drawn faded in her
# colour (orange: every tenant keeps one colour throughout the series): free, owned by nobody, still
# holding her data (`PageStatus.STALE`).

# %%
state = replay(engine.log, engine.pool.num_pages)["single"]
assert state.pages(PageStatus.STALE) == sorted(alice_pages)
page_map(engine.log, engine.pool.num_pages, page_size=16)

# %% [markdown]
# Bob arrives next. The free list hands him alice's pages, in the same order. The engine logs an
# `allocate` and then, in the same step, a `write` of his prompt; the picture shows the moment in
# between: his pages hatched in his colour over her data.

# %%
engine.submit(Request("bob: save pin 4455.\n", tenant="bob", max_tokens=32, request_id="bob-1"))
engine.step()  # bob's prefill
bob_pages = engine.seqs["bob-1"].block_table
print("bob-1 got pages", bob_pages)
assert bob_pages == alice_pages[: len(bob_pages)]
handover = find_event(engine.log, "allocate", request_id="bob-1")
assert replay(engine.log, 16, handover)["single"].pages(PageStatus.RESERVED) == sorted(bob_pages)
page_map(engine.log, 16, at=handover, request="bob-1", page_size=16)

# %% [markdown]
# His prompt overwrote the first slots. The rest of alice's prompt still sits *inside bob's pages*,
# beyond his last token.

# %%
bob_slots = engine.pool.slots(bob_pages, 0, engine.seqs["bob-1"].num_cached)
kept = [i for i, slot in enumerate(prompt_slots) if slot not in bob_slots]
assert kept and torch.equal(k_all[:, [prompt_slots[i] for i in kept]], k_before[:, kept])
print(f"bob-1 wrote {len(bob_slots)} slots; alice's prompt tokens {kept[0]}..{kept[-1]} are still in his pages")

# %% [markdown]
# He never sees them: attention reads only positions `0 .. num_cached - 1` of *his* block table, and
# he wrote every one of those himself before reading it. The ownership audit checks every read
# against a ledger of who wrote each slot, and it finds nothing. Isolation between tenants rests
# entirely on this bookkeeping, the block table and the length; notebook 05 shows what happens when
# it slips.

# %%
[bob] = engine.run()
print(repr(bob.text), "| reads of someone else's slots:", engine.audit.violations)
assert bob.text == "saved pin 4455." and engine.audit.violations == 0

# %% [markdown]
# ## Watching the pool
#
# A busier run: five requests from four tenants arrive over a few steps on a 16-page pool. The engine
# records every allocation, write, read and free in `engine.log`.

# %%
engine = Engine(model, tok, EngineConfig(num_pages=16, prefix_caching=False))
arrivals = {
    0: [("alice", Note("pin", "0912")), ("bob", Note("card", "4929 1234 5678 9012"))],
    4: [("carol", Note("key", "sk-7Hq2Zp9Xw4"))],
    20: [("dave", Note("name", "Ada Lovelace")), ("alice", Note("todo", "water the plants"))],
}
answers = []
for step in itertools.count():
    for tenant, note in arrivals.get(step, []):
        engine.submit(Request(note_prompt(tenant, note), tenant, max_tokens=48))
    if step > max(arrivals) and not engine.has_work():
        break
    answers += engine.step()
for r in answers:
    print(f"{r.tenant}/{r.request_id}: {r.text!r}")
assert all(r.status == 200 for r in answers) and engine.audit.violations == 0

# %% [markdown]
# Step through it: **Play**, drag the slider, or use previous/next. Each frame is one event that
# changes the picture; the outlined cells are the block table of the request the event is about,
# numbered from block 0 as in the picture of the slot mapping above. The player opens on the moment
# dave's pages are handed out: alice's first request has finished, and dave receives her pages,
# hatched in his colour over her stale data. (A viewer without widgets shows a still of that frame
# in the player's place.)

# %%
opening = find_event(engine.log, "allocate", tenant="dave")
show_replay(engine.log, engine.pool.num_pages, page_size=16, start=opening)
at_opening = replay(engine.log, 16, opening)["single"]
dave_pages = at_opening.block_tables[engine.log.events[opening].request_id]
assert [at_opening.writer_tenant[p] for p in dave_pages] == ["alice"] * len(dave_pages)

# %% [markdown]
# At the end every page is free again, and every page anyone wrote is stale: the pool remembers
# all five requests.

# %%
end = replay(engine.log, engine.pool.num_pages)["single"]
written = sorted({p for e in engine.log.of_kind("write") for p in e.pages})
assert engine.pool.num_free_pages == 16 and end.pages(PageStatus.STALE) == written
page_map(engine.log, engine.pool.num_pages, page_size=16)


# %% [markdown]
# ## Exercises
#
# **1.** Write `slot_of(block_table, page_size, position)`: the pool slot that holds the K/V of token
# `position` of a request with that block table. The checker compares it with `PagePool.slots` on
# eight block tables.

# %%
def slot_of(block_table, page_size, position):
    raise NotImplementedError  # your code here

try_exercise(check_slot_mapping, slot_of)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def slot_of(block_table, page_size, position):
    page = block_table[position // page_size]
    return page * page_size + position % page_size

check_slot_mapping(slot_of)


# %% [markdown]
# **2.** Write `wasted_slots(kv_lens, page_size)`: how many slots a page pool reserves for requests
# with these K/V lengths but leaves empty?

# %%
def wasted_slots(kv_lens, page_size):
    raise NotImplementedError  # your code here

try_exercise(check_wasted_slots, wasted_slots)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def wasted_slots(kv_lens, page_size):
    pages = sum(-(-n // page_size) for n in kv_lens)  # round each request up to whole pages
    return pages * page_size - sum(kv_lens)

check_wasted_slots(wasted_slots)


# %% [markdown]
# **3.** From an event log alone, find the **stale pages**: free at the end of the log, but still
# holding some request's data. Write `stale_pages(events, num_pages)` returning them sorted. Each
# event has `kind`, `request_id` and `pages`. The kinds: `allocate`, `write`, `free`, and `preempt`
# (notebook 03: a request gives all its pages back when the pool runs out, and comes back for new
# ones later). The checker tries it on seven logs and compares with `minikv.viz.replay`.

# %%
def stale_pages(events, num_pages):
    raise NotImplementedError  # your code here

try_exercise(check_stale_pages, stale_pages)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def stale_pages(events, num_pages):
    owner, written = [None] * num_pages, [False] * num_pages
    for e in events:
        for p in e.pages:
            if e.kind == "allocate":
                owner[p] = e.request_id
            elif e.kind in ("free", "preempt") and owner[p] == e.request_id:
                owner[p] = None
            elif e.kind == "write":
                written[p] = True  # free does not erase: once written, a page holds data
    return [p for p in range(num_pages) if owner[p] is None and written[p]]

check_stale_pages(stale_pages)

# %% [markdown]
# Next: **03 · continuous batching and admission control**, where requests join and leave the
# batch every step, and the engine refuses what its pool can never hold.
