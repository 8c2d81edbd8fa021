# %% [markdown]
# # 11 · The leak over HTTP: a real server, the official client, and a probe you can point anywhere
#
# **The code it teaches:** `minikv/serve/app.py` (the routes and keys), `minikv/serve/core.py` (the one loop that steps the engine for every client; `engine_loop.py` is its HTTP side), `minikv/serve/gateway.py` (the server's own log) and `minikv/probe/run.py` (the black-box checks).
#
# **What you will learn**
# - to serve minikv as vLLM and SGLang serve models: an OpenAI-compatible HTTP API, one engine loop
#   batching every connection, API keys that decide who is who;
# - to replay notebook 05's incident with the official `openai` client: Bob's **HTTP 200** carries
#   Alice's card;
# - to scan the gateway log this server wrote itself (notebook 08's `scan-logs`);
# - to check any OpenAI-compatible endpoint from the outside with `python -m minikv probe`.
#
# Everything below goes over real sockets. The servers are the ones `python -m minikv serve` runs in a
# terminal, started on threads of this kernel so that the model is loaded once (`ServerThread`), and
# stopped at the end. Sizes are notebook 05's, the incident scaled by 1/1024: a window of 1,024 tokens
# over a prefill pool of 672.

# %%
import json
import random
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import openai

from minikv.bench.plot import SPLIT_RECORD, split_figure, split_parts
from minikv.disagg.cluster import ClusterConfig, startup_problem
from minikv.logs.gateway_log import GatewayRecord, iter_log
from minikv.logs.scan import Signals, implied_prefill_rate, scan_log
from minikv.probe.run import probe_endpoint
from minikv.model.checkpoint import load_model
from minikv.exercises import try_exercise
from minikv.exercises.nb11_over_http import check_holds_canary, check_tenant_of
from minikv.serve.launch import ServerThread
from minikv.attacks.workload import long_document_prompt

KEYS = {"alice": "sk-alice-7f3a9c", "bob": "sk-bob-2e81d4"}
KEY_ARGS = [a for tenant, key in KEYS.items() for a in ("--api-key", f"{tenant}={key}")]
workdir = Path(tempfile.mkdtemp(prefix="minikv-nb10-"))
vulnerable_log = workdir / "vulnerable-gateway.jsonl"
model, tok = load_model()
vulnerable = ServerThread(["--disagg", "--preset", "vulnerable", *KEY_ARGS, "--log", str(vulnerable_log)], model, tok)
print("\n".join(line for line in vulnerable.startup_log if line.startswith("[")))

# %% [markdown]
# ## The server
#
# That is the command the workshop's first terminal runs:
#
# ```
# python -m minikv serve --disagg --preset vulnerable --api-key alice=sk-alice-7f3a9c --api-key bob=sk-bob-2e81d4 --log gateway.jsonl
# ```
#
# Its startup log names each pool next to the window, as notebook 06 asks every operator to read it:
# the prefill pool holds 672 tokens, the window promises 1,024.
#
# Behind the HTTP routes (`minikv/serve/app.py`, FastAPI served by uvicorn) sits **one engine core**
# (`minikv/serve/core.py`): a loop that owns the cluster, takes requests from every connection, steps
# the engine, and sends back each step's new tokens, which the HTTP side streams to each client. Here it
# runs on a thread of this kernel; `minikv serve` in a terminal runs it in a process of its own. The key in the header
# `Authorization: Bearer <key>` decides the tenant; nothing in the request body can. The official
# client needs only the address and a key:

# %%
alice = openai.OpenAI(base_url=vulnerable.base_url, api_key=KEYS["alice"])
bob = openai.OpenAI(base_url=vulnerable.base_url, api_key=KEYS["bob"])
[card] = alice.models.list().data
print(card.id, "window:", card.max_model_len, "tokens")
assert card.max_model_len == 1024

# %% [markdown]
# ## Alice, then Bob
#
# Alice asks the assistant to keep her card number (it passes the Luhn check, like a real card's). Then
# Bob sends an 800-token document: more than the prefill pool, inside the advertised window.

# %%
CARD = "4539 1488 0343 6467"
saved = alice.chat.completions.create(model=card.id, messages=[{"role": "user", "content": f"alice: save card {CARD}."}])
print("alice:", repr(saved.choices[0].message.content), "prompt_tokens:", saved.usage.prompt_tokens)
assert saved.choices[0].message.content == f"saved card {CARD}."

bob_prompt = long_document_prompt("bob", 800, random.Random(0))
reply = bob.completions.create(model=card.id, prompt=bob_prompt, max_tokens=64)
print("bob:  ", repr(reply.choices[0].text), "prompt_tokens:", reply.usage.prompt_tokens)
assert CARD in reply.choices[0].text and reply.usage.prompt_tokens == 800

# %% [markdown]
# The client raised nothing: for it this was an ordinary **200**, with `usage.prompt_tokens` at Bob's
# 800 and a fluent reply. The reply is Alice's, through the same code path as every other request
# (notebook 05 shows each step). In a workshop, Bob's terminal can send the same with `curl`:
#
# ```
# curl -s http://127.0.0.1:8000/v1/completions -H "Authorization: Bearer sk-bob-2e81d4" \
#      -H "Content-Type: application/json" -d "{\"model\": \"tiny-llama\", \"max_tokens\": 64, \"prompt\": \"bob: read $(python -c 'print("the report " * 78)')\"}"
# ```
#
# ## The server's own gateway log
#
# Every call, served or refused, went into the gateway log in the schema notebook 08 reads: `timestamp`,
# `request_id` (the `id` the client got back), `account`, `model`, `prompt_tokens`, `completion_tokens`,
# `ttft_ms`, `status`, `response_text`. No prompt text is written anywhere.

# %%
rows = [r for r in iter_log(vulnerable_log) if isinstance(r, GatewayRecord)]
for r in rows:
    print(f"{r.account:6} prompt_tokens={r.prompt_tokens:<4} completion_tokens={r.completion_tokens:<3} status={r.status}  {r.response_text!r}")
assert [r.account for r in rows] == ["alice", "bob"] and rows[1].request_id == reply.id

# %% [markdown]
# Now the scan from notebook 08, on this file. The checklist's model and window belong to the real
# incident, so it selects nothing here; its two signals look at every row. The text signal flags both
# replies, because both hold a card number: Alice's is her own, Bob's is not his. A person reviewing the
# flags has to tell them apart.

# %%
result = scan_log(vulnerable_log)
secret_shaped = {f.record.account: [x for x in f.reasons if x != "ttft_anomaly"] for f in result.flags}
print(secret_shaped)
assert secret_shaped == {"alice": ["card_number"], "bob": ["card_number"]}

# %% [markdown]
# The other signal is time. Bob's 800 tokens came back as fast as a short prompt does. To set the
# ceiling from this server's own traffic, as notebook 08 advises, Alice sends three honest prompts of
# 240 tokens (well inside every pool) and we read their prefill rates from the log:

# %%
honest = [alice.completions.create(model=card.id, prompt=long_document_prompt("alice", 240, random.Random(i)), max_tokens=8)
          for i in range(3)]
rows = {r.request_id: r for r in iter_log(vulnerable_log) if isinstance(r, GatewayRecord)}
ceiling = 1.5 * max(implied_prefill_rate(rows[h.id]) for h in honest)  # a margin over the fastest honest call
flagged = {f.record.request_id: f.reasons for f in scan_log(vulnerable_log, signals=Signals(max_prefill_tokens_per_s=ceiling)).flags}
print("alice's 240 tokens:", ", ".join(f"{rows[h.id].ttft_ms:.1f} ms" for h in honest), f"; bob's 800 tokens: {rows[reply.id].ttft_ms:.1f} ms")

# %%
print("bob's call flagged:", flagged[reply.id])
assert flagged[reply.id] == ["ttft_anomaly", "card_number"] and not any(h.id in flagged for h in honest)

# %% [markdown]
# With the ceiling at one and a half times this server's fastest honest rate, `scan-logs` flags Bob's
# call on both signals, and none of Alice's honest ones (from a terminal: `python -m minikv scan-logs
# gateway.jsonl --max-prefill-rate N`). The picture: every call the log holds, the ceiling as a line; a
# call below it came back faster than any honest prefill here could.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times)
fig, ax = plt.subplots(figsize=(6.5, 3.4))
edge = [0, 1024]
ax.fill_between(edge, 0, [1000 * x / ceiling for x in edge], color="#d40000", alpha=0.1, label="faster than the ceiling: flagged")
ax.plot(edge, [1000 * x / ceiling for x in edge], "--", color="black", lw=1, label=f"ceiling {ceiling:,.0f} prompt tokens/s")
calls = {"alice's three honest calls": [rows[h.id] for h in honest], "alice's card": [rows[saved.id]], "bob's reply": [rows[reply.id]]}
for (label, rs), marker, colour in zip(calls.items(), "os*", ["#777777", "#e69f00", "#d40000"]):
    ax.scatter([r.prompt_tokens for r in rs], [r.ttft_ms for r in rs], s=200 if marker == "*" else 40, marker=marker,
               color=colour, edgecolor="black", linewidth=0.5, zorder=3, label=label)
    for r in rs:
        if r.request_id in flagged:
            ax.annotate(", ".join(flagged[r.request_id]), (r.prompt_tokens, r.ttft_ms), xytext=(8, 4), textcoords="offset points", fontsize=8)
ax.set_xlabel("prompt_tokens"); ax.set_ylabel("ttft_ms"); ax.set_xlim(0, 1024); ax.set_ylim(bottom=0)
ax.legend(fontsize=8, loc="upper right"); ax.set_title("The server's own gateway log: every call it answered", fontsize=10)
plt.tight_layout(); plt.show()

# %% [markdown]
#
# ## The safe server
#
# With the safe preset the same command does not even start: `startup_check` compares every pool with
# the window and refuses, naming both.

# %%
problem = startup_problem(ClusterConfig())
print(problem)
assert "1024" in problem and "672" in problem

# %% [markdown]
# Following its advice, the window comes down to the pool: `--context-len 672`. Now Bob's document is
# refused at the door: a **400** in OpenAI's error shape, code `context_length_exceeded`, both numbers
# named; the official client raises `BadRequestError`.

# %%
safe = ServerThread(["--disagg", "--preset", "safe", "--context-len", "672", *KEY_ARGS], model, tok)
alice_safe = openai.OpenAI(base_url=safe.base_url, api_key=KEYS["alice"])
bob_safe = openai.OpenAI(base_url=safe.base_url, api_key=KEYS["bob"])
alice_safe.chat.completions.create(model=card.id, messages=[{"role": "user", "content": f"alice: save card {CARD}."}])
try:
    bob_safe.completions.create(model=card.id, prompt=bob_prompt, max_tokens=64)
except openai.BadRequestError as e:
    refusal = e
print(refusal.status_code, json.dumps(refusal.body))
assert refusal.status_code == 400 and refusal.body["code"] == "context_length_exceeded"

# %% [markdown]
# ## The probe: checking an endpoint from the outside
#
# A customer cannot read the provider's startup log or its pools: they have the API and their own keys.
# `python -m minikv probe URL --key KEY_A --key KEY_B` uses exactly that, two keys the user owns, and
# runs four checks, each printing what it sent, what came back and a verdict:
#
# 1. **canary**: key A saves a random canary; right after, key B sends long prompts, up to the window
#    and past it. Any 8 characters of the canary in B's reply is another tenant's data.
# 2. **over-length**: a prompt past the window must be refused; and a top-of-window prompt answered
#    in under half the time that short prompts' times predict was never read (prefill reads every token).
# 3. **prompt-token honesty**: `usage.prompt_tokens` matches what was sent, and time to first token
#    does not fall as the prompt grows.
# 4. **shared prefix cache**: Gu et al.'s audit of notebook 09, with its Kolmogorov-Smirnov test: are
#    key B's requests for key A's prompts faster than fresh ones? Only if B read the cache A filled.
#
# The probe is bounded (`--budget` requests, 200 by default; `--time-limit` seconds). Exit status 0
# means every check passed, 1 that one failed, 2 that the endpoint could not be probed or a check could
# not finish (a refused key, no usage reported, the budget or time limit reached, requests that failed
# with 5xx: `docs/serve.md` lists every case).
#
# A canary that does not come back proves little: what a leak shows depends on what the freed pages hold
# at that moment, and the probe's PASS says so in words. So that each verdict below is taken on a known
# state, the probe runs against a *freshly started* vulnerable server, beside the safe one:

# %%
fresh = ServerThread(["--disagg", "--preset", "vulnerable", *KEY_ARGS], model, tok)
reports = {name: probe_endpoint(server.url, KEYS["alice"], KEYS["bob"], rounds=6, seed=0)
           for name, server in (("vulnerable", fresh), ("safe", safe))}
fresh.stop()
print(f"{'check':22} {'vulnerable':12} safe")
for check in reports["safe"].verdicts():
    print(f"{check:22} {reports['vulnerable'].verdicts()[check]:12} {reports['safe'].verdicts()[check]}")
print("exit status:", reports["vulnerable"].status, reports["safe"].status)
assert reports["vulnerable"].verdicts()["canary"] == reports["vulnerable"].verdicts()["over-length"] == "fail"
assert set(reports["safe"].verdicts().values()) == {"pass"} and (reports["vulnerable"].status, reports["safe"].status) == (1, 0)

# %% [markdown]
# The two failures on the vulnerable server, as the probe printed them. Its timings (the `ms` figures)
# change from run to run; the verdicts do not.

# %%
for check in reports["vulnerable"].results[:2]:
    print(check.format())

# %% [markdown]
# The vulnerable server's other two checks are *incomplete*, not passed: with every switch off,
# `transfer_batch_cap` is off too, so a KV transfer of more than 15 pages outlasts the decode node's
# timeout and ends in a 500 (notebook 07's family). The probe reports what it could not measure rather
# than guess. The fourth check finds a prefix cache shared across keys: `python -m minikv serve
# --disable cache_salt --disable cache_partition` fails it (`tests/test_probe.py` pins that verdict; the
# partition alone already keeps each tenant's hits its own, notebook 10).
#
# ## What to run, and who runs it
#
# - **A customer** against a provider: `python -m minikv probe https://api.provider.example --key KEY_A
#   --key KEY_B --model M`, with two keys of their own. It sends only what an ordinary client sends,
#   within the budget, and the canary is the customer's own. Keep the report: its request ids and
#   timestamps are what the provider's support needs.
# - **An operator** against their own deployment, before and after every change to pools, context
#   length or caching: the probe, plus what only they can see, the startup log's pools against the
#   window and `scan-logs` over the gateway's log.
# - **Anyone**, on a real engine: start vLLM or SGLang with two API keys and point the probe at it.
#
# The workshop version takes three terminals (`docs/workshop.md`):
#
# ```
# # 1: the server
# python -m minikv serve --disagg --preset vulnerable --api-key alice=sk-alice-7f3a9c --api-key bob=sk-bob-2e81d4 --log gateway.jsonl
# # 2: Alice
# python -c "import openai; c = openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='sk-alice-7f3a9c'); print(c.chat.completions.create(model='tiny-llama', messages=[{'role': 'user', 'content': 'alice: save card 4539 1488 0343 6467.'}]).choices[0].message.content)"
# # 3: Bob, then the scan and the probe
# python -c "import openai; c = openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='sk-bob-2e81d4'); print(c.completions.create(model='tiny-llama', prompt='bob: read ' + 'the report ' * 78 + '\n', max_tokens=64).choices[0].text)"
# python -m minikv scan-logs gateway.jsonl
# python -m minikv probe http://127.0.0.1:8000 --key sk-alice-7f3a9c --key sk-bob-2e81d4
# ```
#
# Both servers stop here, as Ctrl-C stops them in a terminal: each finishes what is in flight, then its
# engine loop ends. `stop()` returns what the process's exit status would be: 0, a clean stop.

# %%
for c in (alice, bob, alice_safe, bob_safe):
    c.close()
exit_statuses = [vulnerable.stop(), safe.stop()]
print("exit status of each server:", exit_statuses)
assert exit_statuses == [0, 0]

# %% [markdown]
# ## Why `minikv serve` gives its engine core a process of its own
#
# In this notebook the engine core runs on a thread of the kernel, beside the HTTP side: one Python
# interpreter, so one interpreter lock for both. Only one of them runs Python at a time; while the event
# loop parses a request or writes a chunk, the engine waits for the lock, even with a core free.
# `minikv serve` in a terminal spawns the same loop (`CoreLoop`, `minikv/serve/core.py`) in a process of
# its own, as vLLM runs its engine core and SGLang its scheduler. The HTTP process sends it `Submit` and
# `Cancel` messages and reads back one `StepOutput` a step (`minikv/serve/engine_loop.py`).
#
# The picture is a measurement of ours, recorded on this project's 2-core machine (the record names the
# machine, the date and the command, `python scripts/profile_serve.py --split`, about 2.5 minutes): the
# same server started both ways, both up at once, streaming clients on the same machine sending the
# benchmark's requests to each in turn, 4 rounds each. Each bar is as long as the machine's time per token
# served (2 cores × wall time ÷ tokens), cut into what each part spent on a CPU (read from `/proc`), medians
# of the rounds. The light part is time no part of the test used: on a thread, the engine waiting for the
# interpreter lock while a core sat idle. In a process of its own that part shrinks, and the same tokens
# take less of the machine.

# %%
split = json.loads(SPLIT_RECORD.read_text())
print(split["machine"], split["date"])
for clients, rounds in split["rounds"].items():
    parts = split_parts(rounds, split["cores"])
    thread, process = parts["thread"], parts["process"]
    print(f"{clients:>3} clients: {thread['tokens_per_s']:,.0f} tokens/s with the core on a thread, "
          f"{process['tokens_per_s']:,.0f} in a process ({process['tokens_per_s'] / thread['tokens_per_s']:.2f}x); "
          f"unused: {thread['rest'] / thread['machine']:.0%} of the machine, then {process['rest'] / process['machine']:.0%}")
    assert process["tokens_per_s"] > thread["tokens_per_s"] and process["rest"] < thread["rest"]
split_figure(split)

# %% [markdown]
# The clients take a quarter to a third of the machine here: on a laptop they share its cores with the
# server, as they do in every benchmark of this series. The engine alone, with no HTTP and no clients, is
# faster still (docs/benchmarks.md).
#
# ## Exercises
#
# **1.** The server decides who a request comes from by its key alone. Write `tenant_of(authorization,
# keys)`: given the request's `Authorization` header (a string, or None when there is none) and the
# server's `{key: tenant}` table, the tenant the request runs as, or None where the server answers 401.
# The checker compares it with the server's own rule (`minikv/serve/app.py`, read it after).

# %%
def tenant_of(authorization, keys):
    raise NotImplementedError  # your code here

try_exercise(check_tenant_of, tenant_of)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: the word Bearer (any case), a space, a key the table knows; a tenant's name is not a key.
def tenant_of(authorization, keys):
    scheme, _, key = (authorization or "").partition(" ")
    return keys.get(key.strip()) if scheme.lower() == "bearer" else None

check_tenant_of(tenant_of)

# %% [markdown]
# **2.** The probe's canary check. A leak returns *fragments* of other tenants' data (the disclosure's
# word), so the probe does not look for the whole 16-character canary. Write `holds_canary(text,
# canary)`: True when `text` contains any 8 characters in a row of `canary`.

# %%
def holds_canary(text, canary):
    raise NotImplementedError  # your code here

try_exercise(check_holds_canary, holds_canary)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: every 8-character window of the canary, looked for in the reply.
def holds_canary(text, canary):
    return any(canary[i:i + 8] in text for i in range(len(canary) - 7))

check_holds_canary(holds_canary)

# %% [markdown]
# **3.** (Open.) Start `python -m minikv serve --disable cache_salt --disable cache_partition --api-key
# a=KA --api-key b=KB` in a terminal and probe it. Which check fails, and what would key B learn about key
# A's prompts? Then restart it with only one of the two switches off.
