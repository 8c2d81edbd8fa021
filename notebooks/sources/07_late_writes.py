# %% [markdown]
# # 07 · The late-write race and deferred release
#
# **The code it teaches:** `minikv/disagg/transfer/inprocess.py` (a write already on the wire), `minikv/disagg/decode_node.py` (deferred release) and `minikv/attacks/scenarios.py` (Carol and Dave).
#
# **What you will learn**
# - why a KV transfer, once posted, cannot be called back: it behaves like an RDMA write already on the wire;
# - how an aborted request's late write lands in pages the decode node has meanwhile given to someone else;
# - the two mitigations the maintainers recommended for this family of bugs: **deferred KV release** (keep
#   an aborted request's pages until every write aimed at them has landed) and a **cap on the transfer batch
#   size** (so that no single batch outlasts the receiver's timeout).
#
# The incident disclosure names this as a second, separate family of bugs: *late RDMA writes from an aborted
# request could land in pages that already belonged to another request.*

# %%
import torch

from minikv.model.checkpoint import load_model
from minikv.disagg.cluster import ClusterConfig
from minikv.attacks.scenarios import run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.exercises import try_exercise
from minikv.exercises.nb07_late_writes import check_largest_safe_cap, check_times_out
from minikv.viz import find_event, page_map, show_replay, timeline
from minikv.viz.queues import wire_spans

torch.manual_seed(0)
model, tok = load_model()
config = ClusterConfig()
vulnerable = SafetySwitches.preset("vulnerable")
KEY = "sk-live-7Hq2Zp9Xw4"
print(f"transfer: {config.transfer_base_latency} tick + 1 tick per page per batch; receiver timeout "
      f"{config.transfer_timeout_ticks} ticks without progress; cap {config.transfer_batch_cap_pages} pages when on")

# %% [markdown]
# ## The race
#
# **Carol** sends a long prompt (600 tokens, 38 pages) that starts with her API key. Without a batch cap, the
# prefill node posts all 38 pages as one batch: it needs 39 ticks on the wire, but the decode node gives up
# after 16 ticks without progress. Decode aborts Carol (HTTP 500) and, without deferred release, **frees her
# pages at once**. The batch is still on the wire. **Dave** arrives; the free list hands him Carol's pages, most
# recently freed first. Dave's own KV arrives; then Carol's batch lands on top of it.

# %%
result = run_scenario("late-write", model, tok, vulnerable, secret=KEY)
carol, dave = result.victim, result.attacker
print("carol:", carol.status, carol.error)
print("dave: ", dave.status, repr(dave.text))
assert carol.status == 500 and "timed out" in carol.error
assert dave.status == 200 and KEY in dave.text, "Dave's reply carries Carol's key"

# %% [markdown]
# The event log tells it in order: the post, the timeout, the free, Dave's reservation, and the late landing.

# %%
log = result.cluster.log
story = [e for e in log.events
         if (e.request_id == "carol-1" and e.kind in ("post", "finish", "free") and e.node != "prefill")
         or (e.request_id == "dave-1" and e.kind == "allocate" and e.node == "decode")
         or (e.kind == "write" and "LATE" in e.detail)]
for e in story:
    print(f"tick {e.step:3d} {e.node:7s} {e.kind:8s} {e.tenant:6s} {e.detail[:90]}")
late = [e for e in story if "LATE" in e.detail]
dave_pages = set(log.events[find_event(log, "allocate", request_id="dave-1", node="decode")].pages)
assert late and dave_pages & set(late[0].pages)

# %% [markdown]
# Carol's late batch covered Dave's pages. The audit saw Dave read slots written by Carol's request:

# %%
events = [e for e in result.cluster.decode_audit.events if e.victim_tenant == "carol"]
print(f"{result.cross_tenant_reads} cross-tenant reads; reader {events[0].reader}, victim "
      f"{events[0].victim_tenant}/{events[0].victim}, pages {list(events[0].pages)}")
assert events and events[0].reader == "dave-1"
page_map(log, {"prefill": config.prefill_pages, "decode": config.decode_pages},
         at=find_event(log, "cross_read", request_id="dave-1"), request="dave-1", page_size=config.page_size)

# %% [markdown]
# The player opens on that read; drag the slider back to watch Carol's pages freed, handed to Dave, and
# overwritten by the late batch.

# %%
show_replay(log, {"prefill": config.prefill_pages, "decode": config.decode_pages}, request="dave-1",
            page_size=config.page_size, start=find_event(log, "cross_read", request_id="dave-1"))

# %% [markdown]
# Notice what the other switches could not do. The KV checksum and the canary check Dave's pages when *his*
# transfer completes, and at that moment they were right; Carol's write landed afterwards. Rejecting over-length
# prompts is irrelevant: nothing here was too long.
#
# ## Deferred release
#
# With `deferred_release`, an aborted request's pages go to a holding list instead of the free list, and come back
# only when no write aimed at them is still on the wire. Dave gets other pages; Carol's batch lands in pages
# nobody uses.

# %%
deferred = run_scenario("late-write", model, tok, vulnerable.with_switches(enable=["deferred_release"]), secret=KEY)
held = [e for e in deferred.cluster.log.events if e.request_id == "carol-1" and e.kind in ("hold", "free") and e.node == "decode"]
for e in held:
    print(f"tick {e.step:3d} {e.kind:5s} {len(e.pages)} pages: {e.detail}")
print("dave:", deferred.attacker.status, repr(deferred.attacker.text))
assert [e.kind for e in held] == ["hold", "free"] and held[1].step > held[0].step
assert KEY not in deferred.attacker.text and deferred.cross_tenant_reads == 0

# %% [markdown]
# The real engine's deferred release also has a timeout (30 s) after which held pages are freed anyway: a
# write that never completes must not leak the pool. Ours waits for the fabric, which always delivers.
#
# ## The batch cap
#
# With `transfer_batch_cap`, the 38 pages go in batches of 8: each lands 9 ticks after it is posted, inside the
# 16-tick timeout, so the receiver keeps seeing progress and nobody is aborted. The cost: one extra wire latency
# per batch.

# %%
capped = run_scenario("late-write", model, tok, vulnerable.with_switches(enable=["transfer_batch_cap"]), secret=KEY)
posts = [e for e in capped.cluster.log.events if e.request_id == "carol-1" and e.kind == "post"]
print(f"carol: {capped.victim.status}; {len(posts)} batches posted: {[len(e.pages) for e in posts]}")
print("dave: ", capped.attacker.status, repr(capped.attacker.text))
assert capped.victim.status == 200 and len(posts) == 5 and KEY not in capped.attacker.text

# %% [markdown]
# On the timeline, Carol's row has a third lane for her KV on the wire: five grey batches, one after the
# other, each landing before the next is posted, while her decode side waits in `decode.transfer`.

# %%
picture = timeline(capped.cluster.log, title="With a batch cap: Carol's transfer in five batches, nobody aborted")
assert len([b for b in wire_spans(capped.cluster.log) if b.request_id == "carol-1"]) == 5
picture


# %% [markdown]
# ## Exercises
#
# **1.** A batch of `n` pages lands `base + ceil(n / rate)` ticks after it is posted, and the receiver gives up
# once `timeout` ticks have passed without a landing (a batch that takes exactly `timeout` ticks still makes it). Write `largest_safe_cap(base, rate, timeout)`: the biggest
# batch that always lands in time. Is the default cap of 8 pages safe here?

# %%
def largest_safe_cap(base, rate, timeout):
    raise NotImplementedError  # your code here

try_exercise(check_largest_safe_cap, largest_safe_cap)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: base + ceil(n / rate) <= timeout  <=>  n <= (timeout - base) * rate
def largest_safe_cap(base, rate, timeout):
    return (timeout - base) * rate

check_largest_safe_cap(largest_safe_cap)
cap = largest_safe_cap(config.transfer_base_latency, config.transfer_pages_per_tick, config.transfer_timeout_ticks)
print("largest safe cap here:", cap, "pages; the default is", config.transfer_batch_cap_pages)
assert config.transfer_batch_cap_pages <= cap

# %% [markdown]
# **2.** Deferred release costs pool space: while Carol's pages are held, they serve nobody. From the `hold` and
# `free` events above, how many page-ticks were held? What would a 30-second timeout mean at your own
# transfer speeds?
#
# **3.** Re-run the vulnerable scenario with `ClusterConfig(transfer_timeout_ticks=40)`. Does Carol still time out?
# Is a long timeout a fix, or does it only move the race?

# %% [markdown]
# **4.** Make exercise 3 exact. A transfer of `pages` pages goes in batches of at most `cap` pages (`None`: one
# batch), one after another, each landing `base + ceil(n / rate)` ticks after it is posted; the receiver gives up
# on a batch that takes more than `timeout` ticks. Write `times_out(pages, base, rate, timeout, cap)`. Then
# answer exercise 3 for Carol with it, and say what the cap changes that a longer timeout does not.

# %%
def times_out(pages, base, rate, timeout, cap):
    raise NotImplementedError  # your code here

try_exercise(check_times_out, times_out)

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: only the largest batch matters, and it is the first one: min(cap, pages) pages.
def times_out(pages, base, rate, timeout, cap):
    largest = pages if cap is None else min(cap, pages)
    return base + -(-largest // rate) > timeout

check_times_out(times_out)
