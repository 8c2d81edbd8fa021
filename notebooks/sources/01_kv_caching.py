# %% [markdown]
# # 01 · KV caching from first principles
#
# **The code it teaches:** `minikv/model/llama.py` (the model and the one hook a cache plugs into), `minikv/model/contiguous_cache.py` (the per-request cache), `minikv/model/decoding.py` (greedy decoding with and without it) and `minikv/attention/dense.py` (the attention interface).
#
# **What you will learn**
# - why a language model that writes one token at a time would redo almost all of its work without a cache;
# - what queries, keys and values are, and why caching the keys and values is *exact*, not an approximation;
# - what the *KV cache* holds: one key and one value vector per token, per layer, per KV head;
# - how to compute its size per token, and why a 1,048,576-token context needs a pool of GPU memory that large;
# - that caching changes the cost, never the answer: our engine and `transformers` produce the same tokens with and without it.
#
# Everything here runs on a laptop CPU in seconds, using the tiny Llama shipped in `data/tiny-llama`
# (trained in this repository by `python -m minikv train`). It plays a note-keeping assistant: you
# tell it `save <field> <value>.` and it answers `saved <field> <value>.`, copying the value from its context.

# %%
import random
import statistics
import time

import matplotlib.pyplot as plt
import torch
from transformers import AutoModelForCausalLM

from minikv.model.checkpoint import default_model_dir, load_model
from minikv.model.contiguous_cache import ContiguousCache
from minikv.model.decoding import generate_with_cache, generate_without_cache
from minikv.exercises import try_exercise
from minikv.exercises.nb01_kv_caching import check_attention_reads, check_kv_bytes_per_token, kv_bytes
from minikv.model.tokenizer import decode
from minikv.attacks.workload import document_sentence, make_prompt

torch.manual_seed(0)
model, tok = load_model()  # CUDA when present, else the CPU
cfg = model.config
print(f"{model.num_parameters():,} parameters: {cfg.num_layers} layers, {cfg.num_heads} heads "
      f"({cfg.num_kv_heads} KV heads) of {cfg.head_dim} dims, {cfg.vocab_size} tokens in the vocabulary")

# %% [markdown]
# ## One request, two ways
#
# A prompt is a line of characters; the tokenizer gives one token per character. Generating means:
# run the model, take the most likely next token (greedy decoding), append it, repeat.

# %%
prompt = "alice: save card 5412 7534 9821 0064.\n"
ids = tok.encode(prompt)
print(len(ids), "prompt tokens:", ids[:12], "...")

# %% [markdown]
# ## Queries, keys and values
#
# Inside every layer, attention turns each token's hidden vector into three vectors:
# - a **query**: what this token is looking for;
# - a **key**: what this token offers, to be matched against later queries;
# - a **value**: what this token hands over when it matches.
#
# Token *t*'s output is a mix of the values of tokens 0 to *t*, weighted by how well its query matches
# their keys. The attention is **causal**: a token never looks at tokens after it. So the key and value
# of a past token are computed from that token and the ones before it, and nothing that comes later can
# change them. Computing them once and keeping them is therefore *exact*: the cache changes the cost,
# never the answer. (A past token's query is needed only for that token's own output, already computed,
# so queries are not kept.)
#
# Check it on the model: compute the keys and values of the prompt, then of the prompt with 20 more
# tokens appended, and compare the prompt's part.

# %%
def keys_and_values(token_ids):
    """Every layer's K and V for `token_ids`, from one forward over a fresh contiguous cache."""
    cache = ContiguousCache(cfg, num_rows=1, max_len=len(token_ids), device=model.device)
    x = torch.tensor([token_ids], device=model.device)
    with torch.inference_mode():
        model(x, cache.positions([0], len(token_ids)).to(model.device), cache.step([0], len(token_ids)))
    return cache.kv[:, :, 0, : len(token_ids)]  # (layers, K and V, T, KVH, D)

appended = tok.encode("save card 4111 2222.")  # 20 more tokens after the prompt
prefix_kv = keys_and_values(ids)
longer_kv = keys_and_values(ids + appended)[:, :, : len(ids)]  # the same prompt positions, recomputed
difference = (prefix_kv - longer_kv).abs().max().item()
print(f"K/V of the {len(ids)} prompt tokens, before and after appending {len(appended)} tokens: "
      f"largest difference {'below 1e-5' if difference < 1e-5 else difference}")
assert torch.allclose(prefix_kv, longer_kv, atol=1e-5)

# %% [markdown]
# The same numbers: any difference is float rounding (a longer input sums in a different order), a few
# millionths. That is the whole idea of the KV cache.
#
# *Without* a cache, each step feeds the whole sequence so far through the model and keeps only the
# last position's logits. *With* a cache, the prompt goes through once (the **prefill**), every
# layer keeps the keys and values it computed, and each later step (a **decode** step) runs just the
# one new token, attending over the stored keys and values.

# %%
no_cache = generate_without_cache(model, ids, max_new_tokens=48, eos_id=tok.eos_token_id)
cached = generate_with_cache(model, ids, max_new_tokens=48, eos_id=tok.eos_token_id)
assert no_cache == cached, "the cache must not change the answer"
print(repr(decode(tok, cached)))

# %% [markdown]
# Same tokens. The difference is the work. Let us time both on a longer prompt: a document to
# read, then a note.

# %%
long_prompt = make_prompt("bob", [document_sentence(random.Random(0), 420), "save pin 0912."])
long_ids = tok.encode(long_prompt)
long_reply = generate_with_cache(model, long_ids, 32, tok.eos_token_id)
assert generate_without_cache(model, long_ids, 32, tok.eos_token_id) == long_reply
print(f"{len(long_ids)}-token prompt {long_prompt[:40]!r}... -> {decode(tok, long_reply)!r}")
assert decode(tok, long_reply) == "saved pin 0912."

# %% [markdown]
# Timing on a laptop is noisy: another program, a browser tab, a second notebook all take the CPU from
# time to time. So time both ways in **rounds**, alternating which goes first, take the ratio *within*
# each round (both halves of a round see about the same load), and keep the **median**: the middle
# value once sorted, which a few runs slowed by another program cannot move. Absolute times depend on
# your machine and on what else it is doing; the ratio is what to compare.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times: they depend on the machine and its load; the assertion does not)
def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

ways = {"no cache": lambda: generate_without_cache(model, long_ids, 16, tok.eos_token_id),
        "with cache": lambda: generate_with_cache(model, long_ids, 16, tok.eos_token_id)}
rounds = []
for r in range(5):
    order = list(ways) if r % 2 == 0 else list(reversed(ways))  # interleaved: each goes first in turn
    rounds.append({name: timed(ways[name]) for name in order})
speed_up = statistics.median(t["no cache"] / t["with cache"] for t in rounds)
print(f"{len(long_ids)}-token prompt, 16 new tokens, median of 5 rounds: "
      f"no cache {statistics.median(t['no cache'] for t in rounds) * 1e3:.0f} ms, "
      f"with cache {statistics.median(t['with cache'] for t in rounds) * 1e3:.0f} ms; speed-up {speed_up:.1f}x")
assert speed_up > 1.5


# %% [markdown]
# ## Cost against length
#
# Count the token positions pushed through the model. Without a cache, step *t* re-runs all
# `prompt + t` tokens, so generating *n* tokens costs about *n* times the prompt. With a cache it
# costs the prompt once plus one token per step.

# %%
def forward_tokens(prompt_len, new_tokens, use_cache):
    if use_cache:
        return prompt_len + (new_tokens - 1)
    return sum(prompt_len + i for i in range(new_tokens))

lengths = [50, 100, 200, 400, 800]
plain = [forward_tokens(n, 32, False) for n in lengths]
cached_cost = [forward_tokens(n, 32, True) for n in lengths]
print("prompt  no-cache  cache")
for n, a, b in zip(lengths, plain, cached_cost):
    print(f"{n:6d} {a:9d} {b:6d}")
assert all(a / b > 20 for a, b in zip(plain, cached_cost))


# %%
# NBVAL_IGNORE_OUTPUT
# (measured times: they depend on the machine and its load)
def step_time(n_tokens, use_cache):
    """Milliseconds for one generation step after `n_tokens` tokens, with or without their K/V cached."""
    x = torch.tensor(tok.encode(("read the report " * 80)[:n_tokens]))
    if use_cache:
        x = x[-1:]  # one new token; the other n-1 are already cached
    cache = ContiguousCache(cfg, 1, n_tokens + 1, model.device)
    if use_cache:
        cache.seq_lens[0] = n_tokens - 1
    step = cache.step([0], len(x))
    start = time.perf_counter()
    with torch.inference_mode():
        model(x[None].to(model.device), cache.positions([0], len(x)).to(model.device), step)
    return (time.perf_counter() - start) * 1e3

samples = {(n, c): [] for n in lengths for c in (False, True)}
for r in range(5):  # interleaved rounds; the median of each point
    for key in (samples if r % 2 == 0 else reversed(list(samples))):
        samples[key].append(step_time(*key))
ms_plain = [statistics.median(samples[n, False]) for n in lengths]
ms_cache = [statistics.median(samples[n, True]) for n in lengths]
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(lengths, ms_plain, "o-", label="no cache: re-run the whole sequence")
ax.plot(lengths, ms_cache, "s-", label="cache: run one token")
ax.set_xlabel("tokens so far"); ax.set_ylabel("one step (ms)"); ax.set_title("Cost of one generation step")
ax.legend(); plt.tight_layout(); plt.show()
assert ms_plain[-1] > ms_cache[-1]

# %% [markdown]
# ## What the cache holds, and what it costs
#
# Each layer stores, for every token, one key and one value vector per **KV head**. So
#
# `bytes per token = layers × 2 (K and V) × KV heads × head_dim × bytes per number`.
#
# Grouped-query attention (several query heads sharing one KV head) exists mostly to shrink this.

# %%
per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4  # float32
assert per_token == cfg.kv_bytes_per_token == kv_bytes(cfg, 1)
print(f"shipped model: {cfg.num_layers} x 2 x {cfg.num_kv_heads} x {cfg.head_dim} x 4 bytes = {per_token:,} bytes per token")
print(f"a 1,024-token context: {kv_bytes(cfg, 1024) / 2**20:.1f} MiB")

# %% [markdown]
# That is small. Real models are not. The incident's service advertised a context window of
# **1,048,576** tokens. Its model's exact shape was not disclosed, so take a well-known shape as a
# yardstick: a Llama-3-70B-like model (80 layers, 8 KV heads of 128 dims, 2-byte bfloat16 numbers).

# %%
big_per_token = 80 * 2 * 8 * 128 * 2
print(f"{big_per_token:,} bytes = {big_per_token / 1024:.0f} KiB per token")
for tokens in (1_048_576, 681_280):
    print(f"{tokens:>9,} tokens -> {tokens * big_per_token / 2**30:,.0f} GiB of KV cache")
assert 1_048_576 * big_per_token == 320 * 2**30

# %% [markdown]
# One full-length request would need 320 GiB for its keys and values alone, several GPUs' worth of
# memory. No engine gives each request its own 320 GiB reservation: they share one big pool of
# fixed-size pages among all requests (notebook 02). In the incident, the prefill GPUs' pool held
# **681,280** tokens, less than the advertised window, and that mismatch is where the trouble began.
# In this series every token count is scaled by **1/1024**: the window becomes 1,024 tokens and
# that pool about 665 tokens.
#
# ## The reference: transformers
#
# Our model is our own code, so check it against the library everyone uses. `transformers` loads the
# same checkpoint; its `generate` with `use_cache=False` and `use_cache=True` must agree with us.

# %%
hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).to(model.device).eval()
x = torch.tensor([ids], device=model.device)
outs = {}
for use_cache in (False, True):
    y = hf.generate(x, max_new_tokens=48, do_sample=False, use_cache=use_cache, pad_token_id=tok.pad_token_id)
    outs[use_cache] = y[0, len(ids):].tolist()
assert outs[False] == outs[True] == cached
print("transformers, with and without its cache, generates exactly our tokens:", repr(decode(tok, outs[True])))


# %% [markdown]
# ## Exercises
#
# **1.** Write `kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_value)`.
# The checker tries it on five model shapes, including a multi-query model with one KV head.

# %%
def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_value):
    raise NotImplementedError  # your code here

try_exercise(check_kv_bytes_per_token, kv_bytes_per_token)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution
def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_value):
    return num_layers * 2 * num_kv_heads * head_dim * bytes_per_value

check_kv_bytes_per_token(kv_bytes_per_token)


# %% [markdown]
# **2.** The cache saves *computing* keys and values, not *reading* them. Write
# `attention_reads(prompt_len, new_tokens)`: with a cache, how many key/value vectors does attention
# read (in one layer, one head) to generate `new_tokens` tokens after a `prompt_len`-token prompt?
# The prefill runs the prompt at once, each position reading itself and every position before it; each
# decode step then runs one new token over everything cached. (The first new token comes out of the
# prefill; the last one is never fed back in.)

# %%
def attention_reads(prompt_len, new_tokens):
    raise NotImplementedError  # your code here

try_exercise(check_attention_reads, attention_reads)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: every position fed in, 0 .. prompt_len + new_tokens - 2, reads itself and all before it.
def attention_reads(prompt_len, new_tokens):
    fed = prompt_len + new_tokens - 1
    return fed * (fed + 1) // 2

check_attention_reads(attention_reads)

# %% [markdown]
# **3.** (Open.) With a cache, the decode step still reads every cached key and value. Time a
# decode step at 100 and at 1,000 cached tokens with `step_time` above: does it grow? Why is it
# still far cheaper than recomputing?
#
# Next: **02 · page pools and block tables**, where many requests share one pool of pages.
