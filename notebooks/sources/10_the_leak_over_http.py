# %% [markdown]
# # 10 · The leak over HTTP: a real server, the official client, and a probe you can point anywhere
#
# **What you will learn**
#
# - to serve minikv the way vLLM and SGLang serve models: an OpenAI-compatible HTTP API (FastAPI + uvicorn), one engine loop batching every connection, bearer keys that decide who is who;
# - to replay notebook 05's incident with the official `openai` client: Alice saves a card number with her key, Bob sends a long document with his, and Bob's **HTTP 200** carries Alice's card;
# - to run `scan-logs` from notebook 08 on the gateway log this server wrote itself, and see Bob's call flagged;
# - to check any OpenAI-compatible endpoint from the outside with `python -m minikv probe`: over-length prompts, honest token counts, a canary between two keys, and Gu et al.'s audit for a prefix cache shared across keys;
# - what a customer can run against a provider, and what an operator can run against their own deployment.
#
# Everything below goes over real sockets. The servers are the uvicorn servers `python -m minikv serve` runs in a terminal, started on threads of this notebook's kernel so that the model is loaded once (`ServerThread`; `ServerProcess` starts the same command as a child process, as the tests do), and stopped at the end. Sizes are notebook 05's, the incident scaled by 1/1024: an advertised window of 1,024 tokens over a prefill pool of 672.

# %%
import json
import random
import tempfile
from pathlib import Path

import openai

from minikv.disagg.cluster import ClusterConfig, startup_problem
from minikv.logs.gateway_log import GatewayRecord, iter_log
from minikv.logs.scan import Signals, implied_prefill_rate, scan_log
from minikv.probe.run import probe_endpoint
from minikv.model.checkpoint import load_model
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
# Its startup log names each pool next to the context window, as notebook 06 asks every operator to read it: the prefill pool holds 672 tokens, the window promises 1,024. Behind the HTTP routes (`minikv/serve/app.py`) sits **one engine loop** (`minikv/serve/engine_loop.py`): a thread that owns the cluster, takes requests from every connection, steps the engine, and streams each client its tokens. The key in `Authorization: Bearer ...` decides the tenant; nothing in the request body can. The official client needs only the address and a key:

# %%
alice = openai.OpenAI(base_url=vulnerable.base_url, api_key=KEYS["alice"])
bob = openai.OpenAI(base_url=vulnerable.base_url, api_key=KEYS["bob"])
[card] = alice.models.list().data
print(card.id, "window:", card.max_model_len, "tokens")
assert card.max_model_len == 1024

# %% [markdown]
# ## Alice, then Bob
#
# Alice asks the assistant to keep her card number (the number passes the Luhn check, like a real card's). Then Bob sends an 800-token document: more than the prefill pool, inside the advertised window.

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
# The client library raised nothing: for it this was an ordinary **200**, with `usage.prompt_tokens` at exactly Bob's 800 and a fluent reply. The reply is Alice's. It went through the same code path as every other request: the prefill node marked Bob's prompt for a 400 and swapped it for a one-token placeholder, the vulnerable gates never read that mark, and the decode node answered over pages Alice had just freed (notebook 05 shows each step).
#
# In a workshop, Bob's terminal can send the same thing with `curl`:
#
# ```
# curl -s http://127.0.0.1:8000/v1/completions -H "Authorization: Bearer sk-bob-2e81d4" \
#      -H "Content-Type: application/json" -d "{\"model\": \"tiny-llama\", \"max_tokens\": 64, \"prompt\": \"bob: read $(python -c 'print("the report " * 78)')\"}"
# ```
#
# ## The server's own gateway log
#
# Every call, served or refused, went into the gateway log in the schema notebook 08 reads: `timestamp`, `request_id` (the `id` the client got back), `account`, `model`, `prompt_tokens`, `completion_tokens`, `ttft_ms`, `status`, `response_text`. No prompt text is written anywhere.

# %%
rows = [r for r in iter_log(vulnerable_log) if isinstance(r, GatewayRecord)]
for r in rows:
    print(f"{r.account:6} prompt_tokens={r.prompt_tokens:<4} completion_tokens={r.completion_tokens:<3} status={r.status}  {r.response_text!r}")
assert [r.account for r in rows] == ["alice", "bob"] and rows[1].request_id == reply.id

# %% [markdown]
# Now the scan from notebook 08, on this file. The checklist's model and window belong to the real incident, so it selects nothing here; the two signals look at every row. Both replies hold a card number: Alice's is her own, Bob's is not his.

# %%
result = scan_log(vulnerable_log)
secret_shaped = {f.record.account: [x for x in f.reasons if x != "ttft_anomaly"] for f in result.flags}
print(secret_shaped)
assert secret_shaped == {"alice": ["card_number"], "bob": ["card_number"]}

# %% [markdown]
# The other signal is time. Bob's 800 tokens came back as fast as a short prompt does. To set the ceiling from this server's own traffic, as notebook 08 advises, Alice sends three honest long-ish prompts (240 tokens, well inside every pool) and we read the implied prefill rates from the log:

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
# With the ceiling at one and a half times this server's fastest honest rate, `scan-logs` flags Bob's call on both signals, and none of Alice's honest ones. From a terminal: `python -m minikv scan-logs gateway.jsonl --max-prefill-rate N`.
#
# ## The safe server
#
# With the safe preset the same command does not even start: `startup_check` compares every pool with the window and refuses, naming both.

# %%
problem = startup_problem(ClusterConfig())
print(problem)
assert "1024" in problem and "672" in problem

# %% [markdown]
# Following its advice, the window comes down to the pool: `--context-len 672`. Now Bob's document is refused at the door, a **400** in OpenAI's error shape with code `context_length_exceeded` and both numbers; the official client raises `BadRequestError`.

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
# A customer cannot read the provider's startup log or its pools. What they have is the API and their own keys. `python -m minikv probe URL --key KEY_A --key KEY_B` uses exactly that, with two keys the user owns, and runs four checks, each printing what it sent, what came back and a verdict:
#
# 1. **canary**: key A saves a random canary; right after, key B sends long prompts (from three quarters of the window to its top, then past it). Any 8 characters of the canary in B's reply is another tenant's data.
# 2. **over-length**: a prompt past the advertised window must be refused. And prefill reads every token, so time to first token grows with the prompt: the probe times short prompts (1/64 to 3/16 of the window), draws the line they follow, and a top-of-window prompt answered in less than half the time that line predicts was never read: it was answered 200 over-length.
# 3. **prompt-token honesty**: `usage.prompt_tokens` matches what was sent (the probe measures the endpoint's tokens per word first), and time to first token does not fall as the prompt grows.
# 4. **shared prefix cache**: Gu et al.'s audit (*Auditing Prompt Caching in Language Model APIs*, ICML 2025). Key A sends a random prompt; key B sends the same one and a fresh one of the same length; a two-sample Kolmogorov-Smirnov test (`scipy.stats.ks_2samp`) asks whether B's "hits" are faster. They are only if B read the cache A filled, a side channel that tells B what A sent. `usage.prompt_tokens_details.cached_tokens` says the same where the endpoint reports it.
#
# The probe is bounded: `--budget` requests (200 by default) and `--time-limit` seconds. Exit status 0 means every check passed, 1 that one failed, 2 that the endpoint could not be probed.
#
# A canary that does not come back proves little: what a leak shows depends on what the freed pages hold at that moment, and on a server that has served other traffic (ours served Alice and Bob above, and its prefix cache keeps some of their pages parked) the stale pages Bob's over-length request reserves may hold nothing the model can copy. The probe's PASS says so in words. So that the comparison below shows each check's verdict on a known state, it runs against a *freshly started* vulnerable server, in-process, beside the safe one, six audit rounds each:

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
# The two failures on the vulnerable server, as the probe printed them. Its timings (the `ms` figures) change from run to run; the verdicts do not.

# %%
for check in reports["vulnerable"].results[:2]:
    print(check.format())

# %% [markdown]
# The vulnerable server's other two checks are *incomplete*, not passed: with every switch off, `transfer_batch_cap` is off too, so a KV transfer of more than 15 pages outlasts the decode node's timeout and the request ends in a 500 (the late-write family of notebook 07). The probe reports what it could not measure rather than guessing.
#
# The fourth check needs a prefix cache to find. A single engine with prefix caching and no per-tenant salt, `python -m minikv serve --disable cache_salt`, is what it detects: B's requests for A's prompts skip prefill, and the KS test sees it (`tests/test_probe.py` pins that verdict). With `cache_salt` on, each tenant's prefix hashes apart and the audit passes.
#
# ## What to run, and who runs it
#
# - **A customer** against a provider: `python -m minikv probe https://api.provider.example --key KEY_A --key KEY_B --model M`, with two keys of their own, ideally from two accounts of one organisation. It only sends what an ordinary client sends, within the budget, and it reveals nothing of other customers: the canary is the customer's own. Keep the report: its request ids and timestamps are what the provider's support needs.
# - **An operator** against their own deployment, before and after every change to pools, context length or caching: the same probe, plus what only they can see, the startup log's pools against the window (`startup_check`) and `scan-logs` over the gateway's own log with a ceiling set from their own traffic.
# - **Anyone**, to try it on a real engine: start vLLM or SGLang with two API keys and point the probe at it.
#
# The workshop version takes three terminals:
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
# Both servers stop here, as Ctrl-C stops them in a terminal: each finishes what is in flight, and its engine loop ends.

# %%
for c in (alice, bob, alice_safe, bob_safe):
    c.close()
print("stopped:", vulnerable.stop(), safe.stop())
