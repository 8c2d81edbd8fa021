# %% [markdown]
# # 08 · Detection and response: what a customer can find in their own logs
#
# **The code it teaches:** `minikv/logs/scan.py` (the checklist and the warning signs) and `minikv/logs/gateway_log.py` (the log's schema).
#
# **What you will learn**
#
# - to turn the disclosure's customer checklist into code over your own gateway log, and why each edge matters: one exact model id, both days at the ends of the window, prompts *strictly* above 681,280 tokens;
# - why the HTTP status told you nothing, and the one outward tell that did: a first token too soon for the size of the prompt;
# - to search stored replies for data that is not yours, and where pattern matching stops and a person has to read;
# - what to do next: quarantine, keep the outputs out of other systems and training sets, rotate credentials, ask about notification duties, contact the provider;
# - what the disclosure tells you, and what it leaves open.
#
# You play Northwind, a fictional law firm that reviews bundles of contracts with hosted models. Its gateway logged every call in August and September 2026 in `data/gateway_logs.jsonl.gz`: 40,000 lines written from seed 0 by `python -m minikv make-logs data/gateway_logs.jsonl.gz`. The log is synthetic; the incident inside it follows the disclosed facts in [`docs/incident.md`](../docs/incident.md), and everything else in it (Northwind, its accounts, which calls leaked what, the exact times) is our invention. Token counts here are the real ones, unscaled: a gateway log holds counts, not KV pages, so the 1/1024 scale of the engine notebooks does not apply.

# %%
import gzip
import json
from collections import Counter
from datetime import datetime, time, timedelta, timezone

import matplotlib.pyplot as plt

from minikv.logs.gateway_log import (
    CONTEXT_WINDOW_TOKENS, INCIDENT_FIRST_DAY, INCIDENT_LAST_DAY, INCIDENT_MODEL, OUTAGE_END,
    OUTAGE_START, PREFILL_POOL_TOKENS, SHIPPED_LOG, GatewayRecord, MalformedLine, iter_log,
)
from minikv.exercises import try_exercise
from minikv.exercises.nb08_detection import check_ceiling, check_mrn_pattern, check_unreviewable
from minikv.logs.scan import Checklist, Signals, format_report, implied_prefill_rate, scan_log, scan_records

# %% [markdown]
# ## What the disclosure gives you
#
# Four facts make the checklist: the model `@cf/zai-org/glm-5.3`; the window 2026-08-27 to 2026-09-09 (UTC); prompts longer than **681,280** tokens, the size of the prefill pool, under an advertised context of **1,048,576**; and **155 responses**, across all customers, that carried fragments of other customers' prompts or generations. minikv keeps the first three as constants.

# %%
print(INCIDENT_MODEL, INCIDENT_FIRST_DAY, INCIDENT_LAST_DAY, f"{PREFILL_POOL_TOKENS:,}", f"{CONTEXT_WINDOW_TOKENS:,}")
assert (INCIDENT_MODEL, str(INCIDENT_FIRST_DAY), str(INCIDENT_LAST_DAY)) == ("@cf/zai-org/glm-5.3", "2026-08-27", "2026-09-09")
assert (PREFILL_POOL_TOKENS, CONTEXT_WINDOW_TOKENS) == (681_280, 1_048_576)

# %% [markdown]
# ## The log
#
# One JSON object per line: when (ISO 8601, UTC), which request and account, which model, tokens in and out, the time to first token (`ttft_ms`), the HTTP status and the stored reply. Here is the first line as the gateway wrote it.

# %%
with gzip.open(SHIPPED_LOG, "rt") as f:
    first_line = f.readline().strip()
print(first_line)
assert json.loads(first_line)["timestamp"] == "2026-08-01T00:01:39Z"

# %% [markdown]
# `iter_log` reads the file one line at a time, gzip or not, and turns each line into a `GatewayRecord` (timestamp converted to UTC) or a `MalformedLine` that says what is wrong. Real logs are untidy and this one is too: a line cut short by a crash and a count stored as text are skipped and reported with their line numbers, never dropped in silence.

# %%
items = list(iter_log(SHIPPED_LOG))
records = [item for item in items if isinstance(item, GatewayRecord)]
malformed = [item for item in items if isinstance(item, MalformedLine)]
print(f"{len(items):,} lines: {len(records):,} records, {len(malformed)} malformed")
for m in malformed:
    print(f"  line {m.line}: {m.error}")
assert len(items) == 40_000 and len(malformed) == 2

# %% [markdown]
# Northwind uses five models. GLM-5.3, with its million-token context, gets the biggest share: whole contract bundles go to it.

# %%
calls_per_model = Counter(r.model for r in records)
for model, n in calls_per_model.most_common():
    print(f"{n:>6,}  {model}")
assert len(calls_per_model) == 5 and calls_per_model.most_common(1)[0][0] == INCIDENT_MODEL

# %% [markdown]
# ## Step 1: calls to that model inside the window
#
# The window is a range of UTC *days*, both included: from 2026-08-27 00:00:00 to 2026-09-09 23:59:59. Take the date only after converting to UTC. Two lines in this log were written by other clocks: one in local time (+02:00), one with no zone at all, which minikv reads as UTC and says so.

# %%
zoneless = [r for r in records if r.zone_assumed]
local = next(r for r in records if r.timestamp == datetime(2026, 9, 9, 23, 30, tzinfo=timezone.utc))
with gzip.open(SHIPPED_LOG, "rt") as f:
    written = {n: json.loads(line)["timestamp"] for n, line in enumerate(f, 1) if n in (local.line, zoneless[0].line)}
for r in (local, *zoneless):
    print(f"line {r.line}: written {written[r.line]!r:28} -> UTC {r.timestamp:%Y-%m-%d %H:%M}")
assert local.timestamp.date() == INCIDENT_LAST_DAY  # 10 September on the writer's clock, 9 September in UTC
assert len(zoneless) == 1

# %% [markdown]
# Now step 1 itself: the model id compared exactly (`@cf/zai-org/glm-5.3`, not a look-alike), and the UTC day inside the window.

# %%
checklist = Checklist()  # the disclosure's model, window and threshold
step1 = [r for r in records
         if r.model == checklist.model and checklist.first_day <= r.timestamp.date() <= checklist.last_day]
print(f"{len(step1):,} calls to {checklist.model} from {checklist.first_day} to {checklist.last_day}")
assert len(step1) == 3_262

# %% [markdown]
# ## Step 2: keep the prompts above 681,280 tokens
#
# Every affected response answered a prompt *longer than* 681,280 tokens, so the test is strictly above: a prompt of exactly 681,280 tokens fit the pool and is out. `scan_log` runs the same checklist while streaming the file, and must agree with the list built by hand.

# %%
step2 = [r for r in step1 if r.prompt_tokens > PREFILL_POOL_TOKENS]
result = scan_log(SHIPPED_LOG)  # the same checklist, one line at a time, plus two signals
exactly_the_pool = [r for r in step1 if r.prompt_tokens == PREFILL_POOL_TOKENS]
print(f"{len(step2)} calls in the checklist's set; {len(exactly_the_pool)} call of exactly {PREFILL_POOL_TOKENS:,} tokens left out")
assert [r.request_id for r in step2] == result.affected_ids
assert len(step2) == 22 and len(exactly_the_pool) == 1


# %% [markdown]
# Off-by-one mistakes live at the edges. Here are the long GLM-5.3 calls at the first and last second of a day around the window, and the long calls to other models inside it.

# %%
def show(r: GatewayRecord) -> str:
    return f"{r.timestamp:%Y-%m-%d %H:%M:%S}  {r.model:<40} {r.prompt_tokens:>9,} tokens  in set: {checklist.matches(r)}"

edges = [r for r in records if r.model == INCIDENT_MODEL and r.prompt_tokens > PREFILL_POOL_TOKENS
         and r.timestamp.time() in (time(0, 0, 0), time(23, 59, 59))]
other_models = [r for r in records if r.model != INCIDENT_MODEL and r.prompt_tokens > PREFILL_POOL_TOKENS
                and INCIDENT_FIRST_DAY <= r.timestamp.date() <= INCIDENT_LAST_DAY]
for r in edges + other_models:
    print(show(r))
assert [checklist.matches(r) for r in edges] == [False, True, True, False]
assert other_models and not any(checklist.matches(r) for r in other_models)

# %% [markdown]
# ## The status code said all was well

# %%
statuses = Counter(r.status for r in step2)
print(statuses)
assert statuses == {200: 20, 503: 2}

# %% [markdown]
# Twenty of the 22 calls came back 200 with a fluent reply, and with `prompt_tokens` showing the whole long prompt. The two 503s fell inside the window in which the provider's status page reported "increased errors" (14:25 to 20:09 UTC on 9 September). The disclosure says the model was taken private that day and restored the same evening; that it was unavailable for exactly those hours is our synthetic log's assumption, not the disclosure's. A monitor that checks status codes, like the operators' own long-context tests, sees nothing wrong here.
#
# ## The one outward tell: time to first token
#
# Reading a prompt takes time in proportion to its length. Divide prompt tokens by the time to first token and you get the *implied prefill rate*. Healthy servers in this log read 9,000 to 45,000 tokens a second. A reply whose first token came sooner than any server could read the prompt did not read the prompt. minikv flags rates above a ceiling, 100,000 tokens/s by default; set it from your own traffic.

# %%
ceiling = Signals().max_prefill_tokens_per_s
in_set = set(result.affected_ids)
answered = [r for r in records if implied_prefill_rate(r) is not None]  # a first token came back
rest = [r for r in answered if r.request_id not in in_set]
mine = [r for r in answered if r.request_id in in_set]

fig, ax = plt.subplots(figsize=(8, 5))
ax.scatter([r.prompt_tokens for r in rest], [r.ttft_ms / 1000 for r in rest], s=3, c="0.7", label="other calls")
ax.scatter([r.prompt_tokens for r in mine], [r.ttft_ms / 1000 for r in mine], s=30, c="crimson", label="the checklist's set")
ax.plot([3_000, CONTEXT_WINDOW_TOKENS], [3_000 / ceiling, CONTEXT_WINDOW_TOKENS / ceiling], "k--", lw=1,
        label=f"{ceiling:,.0f} tokens/s: faster is suspicious")
ax.axvline(PREFILL_POOL_TOKENS, color="crimson", lw=0.8, ls=":")
ax.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="time to first token (s)",
       title="Answers that came back too soon")
ax.legend(loc="upper left")
plt.show()

# %% [markdown]
# The red points at the bottom right answered a prompt of 700,000 tokens or more in well under a second: the decode node read one freshly written page and, after it, pages full of other people's data.

# %%
too_fast = [r for r in step2 if (implied_prefill_rate(r) or 0) > ceiling]
slowest = min(implied_prefill_rate(r) for r in too_fast)
print(f"{len(too_fast)} of the {len(step2)} calls came back faster than {ceiling:,.0f} tokens/s; the slowest of them implies {slowest:,.0f}")
assert len(too_fast) == 18 and slowest > 10 * ceiling

# %% [markdown]
# The other four calls in the set: the two 503s, with no first token to time, and two calls after 20:09 on 9 September, when (in our synthetic log) the fixed service read the whole prompt and took a minute or more. The checklist is a superset by design: every affected response is in it, but not every call in it was affected.

# %%
for r in step2:
    if r not in too_fast:
        print(f"{r.timestamp:%Y-%m-%d %H:%M}  status {r.status}  ttft {r.ttft_ms / 1000:7.1f} s")
assert all(r.timestamp >= OUTAGE_START for r in step2 if r not in too_fast)

# %% [markdown]
# The signal is a lead, not a verdict. A few grey points sit below the dashed line too: a second question about the same contract bundle hits the server's prefix cache and skips most of the reading. They are far from the set's prompt sizes, and the checklist, not the signal, decides what is affected.

# %%
fast_outside = [f.record for f in result.flags if "ttft_anomaly" in f.reasons and f.record.request_id not in in_set]
print(f"{len(fast_outside)} calls outside the set were also fast; the largest prompt among them: {max(r.prompt_tokens for r in fast_outside):,} tokens")
assert fast_outside and max(r.prompt_tokens for r in fast_outside) < PREFILL_POOL_TOKENS

# %% [markdown]
# ## A timeline
#
# Where in time did the set fall? Each long GLM-5.3 call is a point; the window is shaded, the day the researcher reported it and the status page's error window are marked.

# %%
utc = timezone.utc
window_start = datetime(2026, 8, 27, tzinfo=utc)
window_end = window_start + timedelta(days=14)
long_calls = [r for r in records if r.model == INCIDENT_MODEL and r.prompt_tokens >= 200_000
              and window_start - timedelta(days=7) <= r.timestamp < window_end + timedelta(days=7)]
groups = {
    "other long GLM-5.3 calls": ([r for r in long_calls if r.request_id not in in_set], "0.6", "o"),
    "in the set, answered too soon": (too_fast, "crimson", "o"),
    "in the set, 503 in the error window": ([r for r in step2 if r.status == 503], "orange", "s"),
    "in the set, served after the fix": ([r for r in step2 if r.status == 200 and r not in too_fast], "tab:blue", "D"),
}
fig, ax = plt.subplots(figsize=(11, 4))
ax.axvspan(window_start, window_end, color="mistyrose", label="window (UTC days, both included)")
ax.axvspan(OUTAGE_START, OUTAGE_END, color="orange", alpha=0.4, label="status page: increased errors, 14:25-20:09")
ax.axvline(datetime(2026, 9, 8, tzinfo=utc), color="k", lw=0.8, ls=":", label="reported (8 September)")
for label, (rows, color, marker) in groups.items():
    ax.scatter([r.timestamp for r in rows], [r.prompt_tokens / 1000 for r in rows], s=20, c=color, marker=marker, label=label)
ax.axhline(PREFILL_POOL_TOKENS / 1000, color="crimson", lw=0.8, ls="--", label="681,280 tokens")
ax.set(ylabel="prompt tokens (thousands)", title="Long GLM-5.3 calls around the window")
ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.01, 1))
fig.autofmt_xdate()
fig.tight_layout()
plt.show()

# %%
days = Counter(r.timestamp.date() for r in too_fast)
print(f"calls answered too soon fell on {len(days)} days, from {min(days)} to {max(days)}")
assert INCIDENT_FIRST_DAY <= min(days) and max(days) <= INCIDENT_LAST_DAY

# %% [markdown]
# ## Step 3: review the stored replies
#
# Now read what came back. minikv looks in every reply for strings shaped like secrets: card numbers that pass the Luhn check, API keys, e-mail addresses, and any pattern you add. Northwind's own replies carry none of these, so every hit here is a piece of someone else's data.

# %%
reasons_by_id = {f.record.request_id: f.reasons for f in result.flags}
for r in step2:
    shapes = [x for x in reasons_by_id.get(r.request_id, []) if x != "ttft_anomaly"]
    print(f"{r.account:<15} {', '.join(shapes) or '-':<26} {r.response_text[:60]!r}")
with_secrets = [r for r in step2 if set(reasons_by_id.get(r.request_id, [])) - {"ttft_anomaly"}]
assert len(with_secrets) == 10

# %% [markdown]
# Three things stand out. Patterns catch only part of it: Initech's board minutes and a patient's record are somebody's documents that no default pattern knows, so a person has to read every reply in the set, flagged or not (exercise 2 adds a pattern). The account `northwind-batch` stores no reply bodies: five replies in the set can never be reviewed, so treat them as exposed. And the two replies served after the fix read like Northwind's own work, as they should.
#
# ## Step 4: were you a source?
#
# Your replies show what you *received*. Whether your data went to someone else, your log cannot show: any call to the model inside the window, of any length, left pages in the shared pool that a later over-long request could have read.

# %%
sources = Counter(r.account for r in step1 if r.status == 200)
for account, n in sources.most_common():
    print(f"{account:<16} {n:>5,} calls to {INCIDENT_MODEL} in the window")
assert sum(sources.values()) == 3_175

# %% [markdown]
# The gateway keeps token counts, not prompts. To know whether those prompts carried keys, passwords or personal data, look at the application that built them. Rotate every credential that may have been sent, and ask whoever handles privacy whether a notification duty applies.
#
# ## Respond
#
# 1. **Quarantine** every reply in the checklist's set, flagged or not, reviewed or not.
# 2. **Keep them out of other systems**: search indexes, CRM notes, caches, analytics, and above all fine-tuning and evaluation sets.
# 3. **Rotate credentials** you may have sent in the window.
# 4. **Ask about notification duties**, both for data you received and for data of yours that may have gone out.
# 5. **Contact the provider** through its support and security-report channels, with request ids and timestamps (the `--json` report has them), and ask whether your account was a source.
#
# Step 1 in code: whatever builds a training set from stored replies must subtract the quarantine.

# %%
quarantine = set(result.affected_ids)
stored = [r for r in records if r.status == 200 and r.response_text]
kept = [r for r in stored if r.request_id not in quarantine]
print(f"quarantined {len(quarantine)} calls; {len(kept):,} of {len(stored):,} stored replies stay usable")
assert not [r for r in kept if set(reasons_by_id.get(r.request_id, [])) - {"ttft_anomaly"}]

# %% [markdown]
# ## The same scan from the command line
#
# ```
# python -m minikv scan-logs data/gateway_logs.jsonl.gz          # a text report
# python -m minikv scan-logs data/gateway_logs.jsonl.gz --json   # {"scanned", "malformed", "affected", "flags"}
# python -m minikv scan-logs LOG --model @cf/zai-org/glm-5.3 --since 2026-08-27 --until 2026-09-09 \
#     --min-prompt-tokens 681280 --max-prefill-rate 100000 --pattern 'MRN \d{8}'
# ```
#
# The exit status is 0 when nothing was found, 1 when something needs review, 2 when the log could not be scanned. The text report starts and ends like this:

# %%
report = format_report(result, checklist, Signals(), "data/gateway_logs.jsonl.gz").splitlines()
print("\n".join(report[:3] + ["..."] + report[-1:]))
assert report[-1] == result.zone_note()


# %% [markdown]
# ## What the disclosure tells you, and what it does not
#
# It tells you which model, which days and which prompt sizes; that 155 responses, across all customers, carried other customers' data; that they came back 200 with a normal-looking usage field and a reply faster than the prompt allows; that no other model was affected; and that no sign of deliberate exploitation was found. That is enough to draw a set around every call that could have received someone else's data.
#
# It does not tell you whether a given call in your set was one of the 155: the set is a superset, and only your own timing and reading narrow it. It does not say what kind of data leaked, whether it was personal data, or which customers were the sources, so your log cannot tell you whether *your* prompts reached someone else. And the second family of bugs, late RDMA writes from aborted requests, comes with no test a customer can run. Those answers only the provider has: ask.
#
# ## Exercises
#
# Each exercise has a checker that tries your answer on small logs it generates, where it knows the right answer; then the cell after the hidden solution applies it to Northwind's log. The solution sits in the hidden cell under each one (click the collapsed cell to show it).
#
# **Exercise 1.** Some replies in the checklist's set came back 200 but were never stored, so no one can read them. Write `unreviewable(affected)`: given the records in the set, the request ids of those replies.

# %%
def unreviewable(affected):
    raise NotImplementedError  # your code here

try_exercise(check_unreviewable, unreviewable)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: a 200 came back with a reply; an empty stored text means nobody can ever read it.
def unreviewable(affected):
    return {r.request_id for r in affected if r.status == 200 and not r.response_text}

check_unreviewable(unreviewable)

# %%
never_stored = unreviewable(result.affected)
print(f"{len(never_stored)} replies in Northwind's set were never stored, from {sorted({r.account for r in result.affected if r.request_id in never_stored})}")
assert never_stored <= in_set

# %% [markdown]
# **Exercise 2.** Some replies hold a patient's medical record number: the word `MRN`, a space, and exactly eight digits. Write a regular expression `mrn_pattern` that, given to `Signals(patterns=(mrn_pattern,))`, flags a reply that holds one, and not its near misses (seven or nine digits, `mrn` in lower case, `XMRN`, a number without `MRN`).

# %%
mrn_pattern = None  # your regular expression here, as a string: r"..."

if mrn_pattern is None:
    print("not solved yet: set mrn_pattern, then run this cell again")
else:
    check_mrn_pattern(mrn_pattern)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: \b keeps MRN a whole word and stops a ninth digit from matching.
mrn_pattern = r"\bMRN \d{8}\b"
check_mrn_pattern(mrn_pattern)

# %%
mrn_hits = {f.record.request_id for f in scan_records(records, signals=Signals(patterns=(mrn_pattern,))).flags
            if f"pattern:{mrn_pattern}" in f.reasons}
print(f"{len(mrn_hits)} replies in Northwind's log hold a record number, all in the checklist's set: {mrn_hits <= in_set}")
assert mrn_hits and mrn_hits <= in_set

# %% [markdown]
# **Exercise 3.** Write `choose_ceiling(records, in_set, outage_start)`: from a log, a prefill-rate ceiling at which the TTFT signal flags every call in the set that came back 200 before `outage_start`, and not a single call outside the set. The checker tries it on five generated logs, each with servers of a different speed, so no fixed number passes. Then: how wide is the range that works in Northwind's log, and what would narrow it in a real one?

# %%
def choose_ceiling(records, in_set, outage_start):
    raise NotImplementedError  # your code here

try_exercise(check_ceiling, choose_ceiling)


# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: anything between the fastest call outside the set (prefix-cache hits) and the slowest leaked call
# works; the geometric middle keeps a margin on both sides on a log scale.
from minikv.logs.scan import implied_prefill_rate

def choose_ceiling(records, in_set, outage_start):
    rates = {r.request_id: implied_prefill_rate(r) for r in records}
    fastest_outside = max(rate for rid, rate in rates.items() if rid not in in_set and rate is not None)
    slowest_leaked = min(rates[r.request_id] for r in records
                         if r.request_id in in_set and r.status == 200 and r.timestamp < outage_start)
    return (fastest_outside * slowest_leaked) ** 0.5

check_ceiling(choose_ceiling)

# %%
northwind_ceiling = choose_ceiling(records, in_set, OUTAGE_START)
fastest_outside = max(implied_prefill_rate(r) for r in rest)
print(f"Northwind: anything between {fastest_outside:,.0f} and {slowest:,.0f} tokens/s works; the function chose {northwind_ceiling:,.0f}")
assert fastest_outside < northwind_ceiling < slowest
# A real log narrows it: bigger cache hits, faster servers, and leaks on prompts nearer the threshold.
