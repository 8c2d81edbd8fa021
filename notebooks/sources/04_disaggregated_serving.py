# %% [markdown]
# # 04 · Disaggregated prefill and decode
#
# **The code it teaches:** `minikv/disagg/prefill_node.py` and `minikv/disagg/decode_node.py` (the six queues), `minikv/disagg/transfer/base.py` (the KV transfer protocol) and `minikv/disagg/cluster.py` (the front door over the pair).
#
# **What you will learn**
# - why serving systems run prompt processing (*prefill*) and token generation (*decode*) on separate GPU pools;
# - the six queues a request passes through, three on each side, and what moves it from one to the next;
# - how the KV cache travels between the two pools like an RDMA write: posted, on the wire, landing later;
# - time to first token (TTFT) against time per output token (TPOT).
#
# Three words first:
# - **SGLang** is an open-source LLM serving engine, like vLLM. Its *disaggregation* package is where the
#   incident's fixes were made; minikv reuses its names (queues, poll states, sender and receiver) so that you
#   can recognise the real code afterwards. Our code is our own.
# - **RDMA** (remote direct memory access) lets one machine's network card write straight into another
#   machine's memory, GPU memory included, without the receiving program taking part. Once a write is posted it
#   is on the wire and cannot be called back; the receiver learns that it landed by polling. minikv's KV
#   transfer imitates that, on one machine.
# - A **bootstrap room** is the meeting point of one request's transfer: a number both nodes know the request by,
#   where the prefill side's *sender* and the decode side's *receiver* find each other (below).

# %% [markdown]
# ## Why split
#
# Prefill pushes a whole prompt through the model at once: lots of arithmetic per byte of weights read. Decode
# pushes one token per request per step: it mostly waits on memory. Run both on the same GPUs and each gets in
# the other's way: a long prefill stalls every decoding request's next token. Splitting them lets each pool be
# sized and batched for its own job. DistServe (OSDI 2024) served 7.4x more requests or met a 12.6x tighter
# latency target this way; Splitwise (ISCA 2024) reported 1.4x throughput at 20% lower cost.
#
# The price is that a request's KV cache must move from the prefill pool to the decode pool, and that two
# separate servers must agree about every request. That agreement is what failed in the incident.

# %%
import statistics

import torch

from minikv.model.checkpoint import load_model
from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer.base import KVPoll
from minikv.engine.engine import Engine
from minikv.exercises import try_exercise
from minikv.exercises.nb04_disaggregated import check_decode_reservation, check_transfer_ticks
from minikv.engine.request import Request
from minikv.viz import find_event, show_replay, stage_spans, timeline

torch.manual_seed(0)
model, tok = load_model()
config = ClusterConfig(prefill_pages=64, decode_pages=128, cache_tenants=3)  # the safe pair's pools cut for three tenants
pair = Cluster(model, tok, config, SafetySwitches.preset("safe"))
for line in pair.startup_log():
    print(line)

# %% [markdown]
# A front door hands every request to both nodes at once, as SGLang's router does, and opens its bootstrap
# room. The decode node learns the prompt's *length*, reserves pages for prompt plus output, and advertises
# them; the prefill node computes the prompt's KV and the first token, and writes them into those pages.
# On the way, each request passes six queues, three per node. On the prefill node:
#
# | queue | what waits there | what moves it on |
# | --- | --- | --- |
# | **bootstrap** | a new request: checked against the pool, given its sender | the decode side has advertised its pages; the transfer is sized from the request's own input |
# | **waiting** | a request ready for its prefill forward | a prefill batch with room: the prompt's K/V and first token are computed and the transfer posted |
# | **inflight** | a prefilled request whose KV is on the wire | every batch has landed: prefill frees its pages |
#
# On the decode node:
#
# | queue | what waits there | what moves it on |
# | --- | --- | --- |
# | **prealloc** | the same request, from the moment it arrives | enough free pages: decode reserves prompt + output and sends the page numbers to prefill |
# | **transfer** | a reservation waiting for its KV | the KV has landed (and passed any checks) |
# | **running** | a request being decoded, one token per step | it finishes: decode frees its pages |
#
# So a request sits in a prefill queue and a decode queue *at the same time*. Watch three requests go through
# (the log's `stage` events, tick by tick):

# %%
prompts = {"alice": "alice: save pin 0912.\n", "bob": "bob: read the weekly report. save memo lunch at noon.\n",
           "carol": "carol: save card 5412 7534 9821 0064.\n"}
ids = {t: pair.submit(Request(p, t, max_tokens=40, request_id=f"{t}-1")) for t, p in prompts.items()}
stages_by_tick, answers = [], {}
while pair.has_work():
    tick = pair.tick
    answers.update((r.request_id, r) for r in pair.step())
    moved = [f"{e.tenant}->{e.detail}" for e in pair.log.events if e.kind == "stage" and e.step == tick]
    if moved:
        stages_by_tick.append((tick, moved))
for tick, moved in stages_by_tick[:8]:
    print(f"tick {tick:2d}: " + ", ".join(moved))

# %%
for tenant, rid in ids.items():
    stages = [e.detail for e in pair.log.for_request(rid) if e.kind == "stage"]
    assert [s for s in stages if s.startswith("prefill")] == ["prefill.bootstrap", "prefill.waiting", "prefill.inflight"]
    assert [s for s in stages if s.startswith("decode")] == ["decode.prealloc", "decode.transfer", "decode.running"]
    print(f"{tenant:6s} {answers[rid].status} {answers[rid].text!r}")

# %% [markdown]
# Splitting changes where the work runs, not the answer: a single node gives the same words.

# %%
single = Engine(model, tok, EngineConfig(num_pages=64)).generate(list(prompts.values()), max_tokens=40)
assert [r.text for r in single] == [answers[ids[t]].text for t in prompts]
print("same words on one node and on the pair")

# %% [markdown]
# ## The transfer
#
# In each request's bootstrap room, a `KVSender` on the prefill side and a `KVReceiver` on the decode side
# poll its state through SGLang's states: **Bootstrapping** (both sides registering), **WaitingForInput** (decode
# has advertised its pages), **Transferring** (page writes posted), **Success** or **Failed**. A posted batch of
# pages lands `base latency + pages` ticks later, like an RDMA write on the wire.

# %%
fresh = Cluster(model, tok, config, SafetySwitches.preset("safe"))
rid = fresh.submit(Request(prompts["carol"], "carol", 8))
receiver = next(iter(fresh.decode.endpoints.values()))
seen, done = [(fresh.tick, receiver.poll())], []
while not done:
    done = fresh.step()
    if receiver.poll() != seen[-1][1]:
        seen.append((fresh.tick, receiver.poll()))
for tick, state in seen:
    print(f"after tick {tick}: {state.name}")
assert [s for _, s in seen] == [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success]

# %% [markdown]
# Both pools, side by side, replayed from the one event log. The player opens on the moment carol's KV lands
# in the pages decode reserved for her (Play, or drag the slider to see the rest):

# %%
landing = find_event(pair.log, "write", request_id=ids["carol"], node="decode")
assert "landed" in pair.log.events[landing].detail
show_replay(pair.log, {"prefill": config.prefill_pages, "decode": config.decode_pages}, page_size=config.page_size,
            start=landing)

# %% [markdown]
# The same run over time. Each request's row has two lanes, prefill's queues on top and decode's below, and a
# third for its KV batches on the wire: the decode node preallocates while the prefill node is still working,
# and the transfer overlaps both.

# %%
picture = timeline(pair.log, title="Three requests through the prefill and decode queues")
spans = stage_spans(pair.log)
for rid in ids.values():
    mine = {s.stage: s for s in spans if s.request_id == rid}
    assert mine["decode.transfer"].start < mine["prefill.inflight"].end  # the two nodes' stages overlap
picture

# %% [markdown]
# ## Time to first token and time per output token
#
# A client sees two latencies: the **time to first token** (TTFT: queueing, prefill, the transfer) and the
# **time per output token** (TPOT: one decode step each). Disaggregation exists to control both separately.
# Counted in the cluster's ticks, from the log, they do not depend on the machine: the first token is ready
# when decode starts running, after the transfer.

# %%
for tenant, rid in ids.items():
    events = pair.log.for_request(rid)
    running = next(e.step for e in events if e.kind == "stage" and e.detail == "decode.running")
    finished = next(e.step for e in events if e.kind == "finish")
    r = answers[rid]
    print(f"{tenant:6s} prompt {r.usage.prompt_tokens:3d} tokens: first token after {running} ticks, "
          f"then {r.usage.completion_tokens - 1} tokens in {finished - running} ticks")
    assert finished - running == r.usage.completion_tokens - 1  # one decode step per further token

# %% [markdown]
# In seconds they depend on your machine and on what else it is doing: a busy laptop can stretch one TTFT a
# hundredfold. So serve the three requests three times and keep the median of each.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times: they depend on the machine and its load)
runs = []
for _ in range(3):
    again = Cluster(model, tok, config, SafetySwitches.preset("safe"))
    runs.append(again.generate(list(prompts.values()), max_tokens=40))
for i, tenant in enumerate(prompts):
    ttft = statistics.median(run[i].ttft_s for run in runs)
    tpot = statistics.median((run[i].token_times_s[-1] - run[i].token_times_s[0]) / (len(run[i].token_times_s) - 1)
                             for run in runs)
    print(f"{tenant:6s} median of 3: TTFT {ttft * 1e3:6.1f} ms, TPOT {tpot * 1e3:5.2f} ms")
    assert ttft > 0 and tpot > 0


# %% [markdown]
# ## Exercises
#
# **1.** The decode node reserves pages for the prompt *and* all the output before any KV arrives. Write
# `decode_pages(prompt_tokens, max_tokens, page_size)`.

# %%
def decode_pages(prompt_tokens, max_tokens, page_size):
    raise NotImplementedError  # your code here

try_exercise(check_decode_reservation, decode_pages)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def decode_pages(prompt_tokens, max_tokens, page_size):
    return -(-(prompt_tokens + max_tokens) // page_size)

check_decode_reservation(decode_pages)


# %% [markdown]
# **2.** One batch is in flight per room at a time, and a batch of `n` pages lands `base + ceil(n / rate)` ticks
# after it is posted. Write `transfer_ticks(num_pages, cap, base, rate)`: ticks until the last page lands when
# batches hold at most `cap` pages (`None`: one batch). Notebook 07 shows why this number matters.

# %%
def transfer_ticks(num_pages, cap, base, rate):
    raise NotImplementedError  # your code here

try_exercise(check_transfer_ticks, transfer_ticks)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def transfer_ticks(num_pages, cap, base, rate):
    size = cap or num_pages
    batches = [min(size, num_pages - i) for i in range(0, num_pages, size)]
    return sum(base + -(-b // rate) for b in batches)

check_transfer_ticks(transfer_ticks)

# %% [markdown]
# Next, **05**: what happens when the prefill node rejects a request and the decode node never hears of it.
