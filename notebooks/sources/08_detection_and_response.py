# %% [markdown]
# # 08 · Detection and response: what a customer can find in their own logs
#
# **The code it teaches:** `minikv/logs/scan.py` (the checklist and the warning signs) and `minikv/logs/gateway_log.py` (the log's schema).
#
# **What you will learn**
#
# - to turn the disclosure's customer checklist into code over your gateway log, edges included: one exact model id, both end days of the window, prompts *strictly* above 681,280 tokens;
# - why the HTTP status told you nothing, and the one outward tell: a first token too soon for the prompt's size;
# - to search stored replies for data not yours, and where patterns stop and a person must read;
# - the response: quarantine, keep outputs out of other systems and training sets, rotate credentials, ask about notification duties, contact the provider;
# - what the disclosure tells you, and what it leaves open.
#
# You play Northwind, a fictional law firm reviewing contract bundles with hosted models. Its gateway logged every call of August and September 2026 in `data/gateway_logs.jsonl.gz` (40,000 lines from seed 0: `python -m minikv make-logs data/gateway_logs.jsonl.gz`). The incident inside follows [`docs/incident.md`](../docs/incident.md); the rest (Northwind, its accounts, which calls leaked what, the times) is our invention. Token counts are real, unscaled: a log holds counts, not KV pages.

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
# Four facts make the checklist: the model `@cf/zai-org/glm-5.3`; the window 2026-08-27 to 2026-09-09 (UTC); prompts longer than **681,280** tokens (the prefill pool) under an advertised context of **1,048,576**; and **155 responses**, across all customers, carrying fragments of others' prompts or generations. minikv keeps the first three as constants.

# %%
print(INCIDENT_MODEL, INCIDENT_FIRST_DAY, INCIDENT_LAST_DAY, f"{PREFILL_POOL_TOKENS:,}", f"{CONTEXT_WINDOW_TOKENS:,}")
assert (INCIDENT_MODEL, str(INCIDENT_FIRST_DAY), str(INCIDENT_LAST_DAY)) == ("@cf/zai-org/glm-5.3", "2026-08-27", "2026-09-09")
assert (PREFILL_POOL_TOKENS, CONTEXT_WINDOW_TOKENS) == (681_280, 1_048_576)

# %% [markdown]
# ## The log
#
# One JSON object per line: time (ISO 8601, UTC), request and account, model, tokens in and out, time to first token (`ttft_ms`), HTTP status, stored reply. The first line:

# %%
with gzip.open(SHIPPED_LOG, "rt") as f:
    first_line = f.readline().strip()
print(first_line)
assert json.loads(first_line)["timestamp"] == "2026-08-01T00:01:39Z"

# %% [markdown]
# `iter_log` reads the file line by line, gzip or not, into `GatewayRecord`s (timestamps in UTC) or `MalformedLine`s saying what is wrong. Real logs are untidy, and so is this one: a line cut short by a crash and a count stored as text are skipped and reported with their line numbers, never dropped silently.

# %%
items = list(iter_log(SHIPPED_LOG))
records = [item for item in items if isinstance(item, GatewayRecord)]
malformed = [item for item in items if isinstance(item, MalformedLine)]
print(f"{len(items):,} lines: {len(records):,} records, {len(malformed)} malformed")
for m in malformed:
    print(f"  line {m.line}: {m.error}")
assert len(items) == 40_000 and len(malformed) == 2

# %% [markdown]
# Northwind uses five models; GLM-5.3, with its million-token context, gets the biggest share: whole contract bundles.

# %%
calls_per_model = Counter(r.model for r in records)
for model, n in calls_per_model.most_common():
    print(f"{n:>6,}  {model}")
assert len(calls_per_model) == 5 and calls_per_model.most_common(1)[0][0] == INCIDENT_MODEL

# %% [markdown]
# ## Step 1: calls to that model inside the window
#
# The window is a range of UTC *days*, both included: 2026-08-27 00:00:00 to 2026-09-09 23:59:59. Convert to UTC before taking the date: one line here is in local time (+02:00), one has no zone (minikv reads it as UTC and says so).

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
# Every affected response answered a prompt *longer than* 681,280 tokens: a prompt of exactly 681,280 fit the pool and is out. `scan_log` runs the same checklist while streaming the file, and must agree with the list built by hand.

# %%
step2 = [r for r in step1 if r.prompt_tokens > PREFILL_POOL_TOKENS]
result = scan_log(SHIPPED_LOG)  # the same checklist, one line at a time, plus two signals
exactly_the_pool = [r for r in step1 if r.prompt_tokens == PREFILL_POOL_TOKENS]
print(f"{len(step2)} calls in the checklist's set; {len(exactly_the_pool)} call of exactly {PREFILL_POOL_TOKENS:,} tokens left out")
assert [r.request_id for r in step2] == result.affected_ids
assert len(step2) == 22 and len(exactly_the_pool) == 1


# %% [markdown]
# Off-by-one mistakes live at the edges: the long GLM-5.3 calls at a day's first and last second around the window, and long calls to other models inside it.

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
# Twenty of the 22 calls came back 200 with a fluent reply and a `prompt_tokens` showing the whole long prompt. The two 503s fell in the status page's "increased errors" window (14:25 to 20:09 UTC, 9 September); that the model was down for exactly those hours is our log's assumption, not the disclosure's. A monitor of status codes, like the operators' long-context tests, sees nothing wrong.
#
# ## The one outward tell: time to first token
#
# Reading a prompt takes time in proportion to its length: prompt tokens divided by the time to first token is the *implied prefill rate*. Healthy servers here read 9,000 to 45,000 tokens a second; a first token sooner than any server could read the prompt means it was not read. minikv flags rates above a ceiling (100,000 tokens/s by default; set it from your own traffic).

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
# The red points at the bottom right answered 700,000 tokens or more in well under a second: decode read one fresh page, then pages of other people's data.

# %%
too_fast = [r for r in step2 if (implied_prefill_rate(r) or 0) > ceiling]
slowest = min(implied_prefill_rate(r) for r in too_fast)
print(f"{len(too_fast)} of the {len(step2)} calls came back faster than {ceiling:,.0f} tokens/s; the slowest of them implies {slowest:,.0f}")
assert len(too_fast) == 18 and slowest > 10 * ceiling

# %% [markdown]
# The other four: the two 503s (no first token to time) and two calls after 20:09 on 9 September, which the fixed service (in our log) read in a minute or more. The checklist is a superset by design: every affected response is in it, not every call in it was affected.

# %%
for r in step2:
    if r not in too_fast:
        print(f"{r.timestamp:%Y-%m-%d %H:%M}  status {r.status}  ttft {r.ttft_ms / 1000:7.1f} s")
assert all(r.timestamp >= OUTAGE_START for r in step2 if r not in too_fast)

# %% [markdown]
# The signal is a lead, not a verdict: a few grey points sit below the dashed line too, second questions about one bundle that hit the prefix cache and skip most of the reading. The checklist, not the signal, decides what is affected.

# %%
fast_outside = [f.record for f in result.flags if "ttft_anomaly" in f.reasons and f.record.request_id not in in_set]
print(f"{len(fast_outside)} calls outside the set were also fast; the largest prompt among them: {max(r.prompt_tokens for r in fast_outside):,} tokens")
assert fast_outside and max(r.prompt_tokens for r in fast_outside) < PREFILL_POOL_TOKENS

# %% [markdown]
# ## A timeline
#
# Where in time did the set fall? Each long GLM-5.3 call is a point; the window is shaded; the report day and the error window are marked.

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
# Now read what came back. minikv looks in every reply for secret-shaped strings: card numbers passing the Luhn check, API keys, e-mail addresses, any pattern you add. Northwind's own replies carry none, so every hit is someone else's data.

# %%
reasons_by_id = {f.record.request_id: f.reasons for f in result.flags}
for r in step2:
    shapes = [x for x in reasons_by_id.get(r.request_id, []) if x != "ttft_anomaly"]
    print(f"{r.account:<15} {', '.join(shapes) or '-':<26} {r.response_text[:60]!r}")
with_secrets = [r for r in step2 if set(reasons_by_id.get(r.request_id, [])) - {"ttft_anomaly"}]
assert len(with_secrets) == 10

# %% [markdown]
# Three things stand out. Patterns catch only part: Initech's board minutes and a patient's record match no default pattern, so a person reads every reply in the set, flagged or not (exercise 2 adds a pattern). `northwind-batch` stores no reply bodies: five replies can never be reviewed, so treat them as exposed. The two replies served after the fix read like Northwind's own work.
#
# ## Step 4: were you a source?
#
# Your replies show what you *received*; whether your data went out, your log cannot show: any call to the model in the window, of any length, left pages a later over-long request could read.

# %%
sources = Counter(r.account for r in step1 if r.status == 200)
for account, n in sources.most_common():
    print(f"{account:<16} {n:>5,} calls to {INCIDENT_MODEL} in the window")
assert sum(sources.values()) == 3_175

# %% [markdown]
# The gateway keeps counts, not prompts: ask the application that built them whether they carried keys, passwords or personal data. Rotate every credential that may have been sent, and ask whoever handles privacy whether a notification duty applies.
#
# ## Respond
#
# 1. **Quarantine** every reply in the checklist's set, flagged or not, reviewed or not.
# 2. **Keep them out of other systems**: indexes, CRM notes, caches, analytics, above all fine-tuning and evaluation sets.
# 3. **Rotate credentials** you may have sent in the window.
# 4. **Ask about notification duties**, for data received and data of yours that may have gone out.
# 5. **Contact the provider** (support and security-report channels) with request ids and timestamps (the `--json` report has them); ask whether your account was a source.
#
# Step 1 in code: a training set built from stored replies must subtract the quarantine.

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
# Exit status 0: nothing found; 1: something needs review; 2: the log could not be scanned. The text report starts and ends like this:

# %%
report = format_report(result, checklist, Signals(), "data/gateway_logs.jsonl.gz").splitlines()
print("\n".join(report[:3] + ["..."] + report[-1:]))
assert report[-1] == result.zone_note()


# %% [markdown]
# ## What the disclosure tells you, and what it does not
#
# It tells you the model, the days and the prompt sizes; that 155 responses across all customers carried others' data, each a 200 with a normal usage field and a reply faster than the prompt allows; that no other model was affected; that no deliberate exploitation was seen. Enough to draw a set around every call that could have received someone else's data.
#
# It does not tell you which calls in your set were among the 155 (your timing and reading narrow it), what kind of data leaked, whether it was personal, or whose it was: your log cannot tell whether *your* prompts reached someone else. The late RDMA writes of aborted requests come with no customer test at all. Only the provider has those answers: ask.
#
# ## Exercises
#
# Each checker tries your answer on small logs it generates, where it knows the answer; the cell after the hidden solution (click the collapsed cell) applies it to Northwind's log.
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
# **Exercise 3.** Write `choose_ceiling(records, in_set, outage_start)`: from a log, a prefill-rate ceiling at which the TTFT signal flags every call in the set that came back 200 before `outage_start`, and no call outside it. The checker tries five generated logs with servers of different speeds, so no fixed number passes. Then: how wide is the working range in Northwind's log, and what would narrow it in a real one?

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
