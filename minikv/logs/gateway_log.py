"""The gateway log, one JSON object per call (docs/logs.md): `iter_log` streams one and never raises on a
bad line; `write_gateway_log` writes a fictional customer's August and September 2026, incident inside."""

import argparse
import gzip
import io
import json
import math
import random
import string
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from functools import partial
from http import HTTPStatus
from pathlib import Path

from minikv.logs.line_reader import OverlongLine, open_log, read_lines, source_name
from minikv.logs.luhn import luhn_check_digit

# The disclosure's facts, as a log sees them (docs/incident.md).
INCIDENT_MODEL = "@cf/zai-org/glm-5.3"
INCIDENT_FIRST_DAY = date(2026, 8, 27)  # window start, UTC, inclusive
INCIDENT_LAST_DAY = date(2026, 9, 9)  # window end, UTC, inclusive
PREFILL_POOL_TOKENS = 681_280  # every affected call's prompt was longer than this
CONTEXT_WINDOW_TOKENS = 1_048_576  # what the model was advertised to accept

# Field -> the JSON types it may hold, in the order a gateway writes them (a whole float is a count, true is not).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "timestamp": (str,), "request_id": (str,), "account": (str,), "model": (str,), "prompt_tokens": (int, float),
    "completion_tokens": (int, float), "ttft_ms": (int, float), "status": (int,), "response_text": (str,)}
COUNT_FIELDS = ("prompt_tokens", "completion_tokens")
SHIPPED_LOG = Path(__file__).resolve().parents[2] / "data" / "gateway_logs.jsonl.gz"  # seed 0, 40,000 rows
MAX_COUNT = 2**53  # token counts past this would lose precision as floats


@dataclass(frozen=True)
class GatewayRecord:
    """One well-formed line of a gateway log, with its timestamp converted to UTC."""
    line: int
    timestamp: datetime
    request_id: str
    account: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    status: int
    response_text: str
    zone_assumed: bool = False  # the line's timestamp had no zone and was read as UTC


@dataclass(frozen=True)
class MalformedLine:
    """A line that is not a record of this schema, and why."""
    line: int
    error: str


def _field_error(name: str, value: object) -> str | None:
    """Why `value` cannot be field `name`, or None when it can."""
    types = FIELD_TYPES[name]
    if isinstance(value, bool) or not isinstance(value, types):
        want = "an integer" if name in COUNT_FIELDS else {str: "a string", int: "an integer", float: "a number"}[types[-1]]
        return f"field {name!r} should be {want}, got {type(value).__name__}"
    if name in COUNT_FIELDS and isinstance(value, float) and not value.is_integer():
        return f"field {name!r} should be a whole number, got {str(value)[:20]}"
    if name in COUNT_FIELDS and not 0 <= value <= MAX_COUNT:
        return f"field {name!r} should be a count from 0 to 2**53, got {str(value)[:20]}"
    if name == "ttft_ms" and not (value == 0 or 0 < value < 1e300):  # no NaN, inf or 10**400
        return f"field 'ttft_ms' should be a finite number >= 0, got {str(value)[:20]}"
    if name == "status" and not 100 <= value <= 599:
        return f"field 'status' should be an HTTP status (100-599), got {value}"
    return None


def parse_timestamp(text: str) -> tuple[datetime, bool]:
    """ISO 8601 date and time -> (aware UTC datetime, True when the text had no zone and UTC was assumed).
    `datetime.fromisoformat` reads the forms (docs/logs.md); a date alone is refused. ValueError for text it
    cannot read, OverflowError when the offset moves the time outside years 1 to 9999."""
    when = datetime.fromisoformat(text)
    if len(text) <= len("2026-08-27"):  # a date alone would silently be read as its midnight
        raise ValueError(f"a date without a time: {text!r}")
    if when.tzinfo is None:
        return when.replace(tzinfo=timezone.utc), True
    return when.astimezone(timezone.utc), False


def parse_record(line: int, text: str) -> GatewayRecord | MalformedLine:
    """One line of text -> a record, or a MalformedLine saying what is wrong. Never raises."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return MalformedLine(line, f"not JSON: {e.msg} (column {e.colno})")
    except (ValueError, RecursionError) as e:  # absurd numbers, absurd nesting
        return MalformedLine(line, f"not JSON: {type(e).__name__}")
    if not isinstance(obj, dict):
        return MalformedLine(line, f"not a JSON object but a {type(obj).__name__}")
    for name in FIELD_TYPES:
        if error := _field_error(name, obj[name]) if name in obj else f"missing field {name!r}":
            return MalformedLine(line, error)
    try:
        when, zone_assumed = parse_timestamp(obj["timestamp"])
    except (ValueError, OverflowError):  # not ISO 8601, or an offset that leaves year 1..9999
        return MalformedLine(line, f"bad timestamp {obj['timestamp'][:40]!r}: want ISO 8601")
    fields = {name: obj[name] for name in FIELD_TYPES} | {name: int(obj[name]) for name in COUNT_FIELDS}
    fields |= {"timestamp": when, "ttft_ms": float(obj["ttft_ms"]), "zone_assumed": zone_assumed}
    return GatewayRecord(line, **fields)


def parse_lines(lines: Iterable[bytes | str | OverlongLine]) -> Iterator[GatewayRecord | MalformedLine]:
    """Parse lines one by one (line numbers start at 1); blank lines are skipped silently."""
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, OverlongLine):
            yield MalformedLine(number, f"a line of {raw.length:,} bytes: too long to be a record, skipped")
            continue
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield MalformedLine(number, "not UTF-8 text")
                continue
        if number == 1:
            raw = raw.removeprefix("\ufeff")  # a byte-order mark some editors write
        raw = raw.rstrip("\r\n")
        if raw.strip():
            yield parse_record(number, raw)


def iter_log(path: str | Path) -> Iterator[GatewayRecord | MalformedLine]:
    """Stream a log's records and malformed lines (`path` '-' is stdin, plain or gzip). LogReadError when it
    cannot be opened, TruncatedLog after the last line it could read."""
    with open_log(path) as stream:
        yield from parse_lines(read_lines(stream, source_name(path)))


# --- A synthetic customer: Northwind, a law firm that reviews contracts with LLMs -----------

LOG_START = datetime(2026, 8, 1, tzinfo=timezone.utc)
LOG_END = datetime(2026, 10, 1, tzinfo=timezone.utc)
BUG_START = datetime.combine(INCIDENT_FIRST_DAY, time(), timezone.utc)
# The status page's "increased errors" window; that the model was down for exactly this window is our log's choice.
OUTAGE_START = datetime(2026, 9, 9, 14, 25, tzinfo=timezone.utc)
OUTAGE_END = datetime(2026, 9, 9, 20, 9, tzinfo=timezone.utc)
DEFAULT_ROWS = 40_000
ACCOUNTS = ("northwind-prod", "northwind-batch", "northwind-dev")
ACCOUNT_WEIGHTS = (0.6, 0.3, 0.1)
BODILESS_ACCOUNT = "northwind-batch"  # stores no response bodies: its replies cannot be reviewed
_dump = partial(json.dumps, separators=(",", ":"))  # one record, compact, as a gateway writes it
RARE_ERRORS = (HTTPStatus.TOO_MANY_REQUESTS,) * 3 + (HTTPStatus.INTERNAL_SERVER_ERROR,)  # 3 rate limits to 1 fault


@dataclass(frozen=True)
class ModelProfile:
    """How the customer uses one model and how fast that model reads a prompt."""
    name: str
    share: float  # of the customer's calls
    context_tokens: int
    prefill_tokens_per_s: tuple[float, float]  # a healthy server's range
    long_share: float  # calls that send a whole bundle of contracts


MODELS = (
    ModelProfile(INCIDENT_MODEL, 0.35, CONTEXT_WINDOW_TOKENS, (9_000, 14_000), 0.015),
    ModelProfile("@cf/meta/llama-4-scout-17b-16e-instruct", 0.15, 1_048_576, (20_000, 30_000), 0.01),
    ModelProfile("@cf/meta/llama-3.3-70b-instruct-fp8-fast", 0.25, 131_072, (15_000, 22_000), 0.0),
    ModelProfile("@cf/qwen/qwen3-30b-a3b-fp8", 0.15, 131_072, (30_000, 45_000), 0.0),
    ModelProfile("@cf/mistralai/mistral-small-3.1-24b-instruct", 0.10, 131_072, (25_000, 35_000), 0.0),
)
REPLIES = (
    "Clause {n} caps liability at the fees paid in the previous twelve months.",
    "The agreement renews automatically unless either party gives {n} days' notice.",
    "The supplier warrants the goods for {n} months from delivery.",
    "No change-of-control clause appears in the documents provided.",
    "Section {n} requires written consent before any assignment.",
    "Governing law is England and Wales; disputes go to arbitration in London.",
    "The indemnity in section {n} excludes indirect and consequential loss.",
    "Both NDAs define confidential information broadly; the second adds a {n}-year tail.",
    "Across the {n} contracts in the bundle, the main risks are the uncapped indemnity and auto-renewal.",
)
FOREIGN_PROSE = (  # other tenants' words: no pattern catches them, a reader does
    "Initech board minutes, item {n}: approve the sale of the Lyon plant before year end.",
    "Patient MRN {mrn}, discharge summary: stable, follow-up in {n} weeks.",
    "the the pool report report page page the tenant tenant",
)


def _card_number(rng: random.Random) -> str:
    """A 16-digit number that passes the Luhn check, grouped in fours."""
    payload = "4" + "".join(str(rng.randrange(10)) for _ in range(14))
    digits = payload + str(luhn_check_digit(payload))
    return " ".join(digits[i : i + 4] for i in range(0, 16, 4))


def _foreign_reply(rng: random.Random) -> str:
    """A fluent reply built from another customer's pages: what a leaked call returned."""
    letters = string.ascii_letters + string.digits
    fragments = [
        f"Forward the term sheet to {rng.choice(['dana.whitfield', 'k.osei', 'mreyes'])}"
        f"@{rng.choice(['globex', 'initech', 'umbrella-health'])}.example for sign-off.",
        f"Card {_card_number(rng)}, expiry {rng.randint(1, 12):02d}/{rng.randint(27, 31)}.",
        "export OPENAI_API_KEY=sk-proj-" + "".join(rng.choice(letters) for _ in range(32)),
        "aws_access_key_id = AKIA" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(16)),
        *(p.format(n=rng.randint(2, 9), mrn=rng.randint(10_000_000, 99_999_999)) for p in FOREIGN_PROSE),
    ]
    return "Summary: " + " ".join(rng.sample(fragments, rng.randint(1, 2)))


def leaked(when: datetime, model: str, prompt_tokens: int) -> bool:
    """Would this call have been answered from stale pages? (the synthetic world's truth)"""
    return model == INCIDENT_MODEL and BUG_START <= when < OUTAGE_START and prompt_tokens > PREFILL_POOL_TOKENS


def simulate_call(rng: random.Random, when: datetime, model: ModelProfile, account: str, prompt_tokens: int) -> dict:
    """The gateway's record of one call, with the service as it behaved at `when`."""
    base_ms = rng.lognormvariate(math.log(180), 0.35)  # queueing, network, first decode step
    long = prompt_tokens >= 100_000
    completion = max(1, min(4096, int(rng.lognormvariate(math.log(800 if long else 300), 0.6))))
    status, text = HTTPStatus.OK, rng.choice(REPLIES).format(n=rng.randint(2, 30))
    if model.name == INCIDENT_MODEL and OUTAGE_START <= when < OUTAGE_END:
        status, completion, ttft_ms, text = HTTPStatus.SERVICE_UNAVAILABLE, 0, rng.uniform(15, 80), ""
    elif rng.random() < 0.01:  # rate limits and the odd server error
        status, completion, ttft_ms, text = rng.choice(RARE_ERRORS), 0, rng.uniform(15, 80), ""
    elif leaked(when, model.name, prompt_tokens):
        ttft_ms = base_ms + rng.uniform(20, 120)  # a one-token placeholder, one page moved
        text = _foreign_reply(rng)
    else:
        uncached = prompt_tokens
        if 100_000 <= prompt_tokens <= 400_000 and rng.random() < 0.25:  # same bundle, next question
            uncached = int(prompt_tokens * rng.uniform(0.02, 0.1))
        ttft_ms = base_ms + 1000 * uncached / rng.uniform(*model.prefill_tokens_per_s)
    return {"timestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"), "request_id": f"req_{rng.getrandbits(64):016x}",
            "account": account, "model": model.name, "prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "ttft_ms": round(ttft_ms, 1), "status": int(status),
            "response_text": "" if account == BODILESS_ACCOUNT else text}


def _ordinary_call(rng: random.Random, when: datetime) -> dict:
    """One call of the customer's everyday traffic."""
    model = rng.choices(MODELS, [m.share for m in MODELS])[0]
    account = rng.choices(ACCOUNTS, ACCOUNT_WEIGHTS)[0]
    if rng.random() < model.long_share:
        prompt_tokens = rng.randint(200_000, model.context_tokens)
    else:
        prompt_tokens = max(8, min(120_000, int(rng.lognormvariate(math.log(1800), 1.0))))
    return simulate_call(rng, when, model, account, prompt_tokens)


def _special_lines(rng: random.Random) -> list[tuple[datetime, str]]:
    """The checklist's edges, placed on purpose, and the untidiness of real logs."""
    glm, scout, llama, qwen = MODELS[:4]
    prod, dev, at = ACCOUNTS[0], ACCOUNTS[2], partial(datetime, tzinfo=timezone.utc)
    calls = [  # (when, model, account, prompt_tokens, what the writer put in place of the call's own fields)
        (at(2026, 8, 26, 23, 59, 59), glm, prod, 900_000, {}),  # the day before the window
        (at(2026, 8, 27, 0, 0, 0), glm, prod, 700_001, {}),  # the window's first second
        (at(2026, 9, 2, 10, 15), glm, prod, PREFILL_POOL_TOKENS, {}),  # exactly the pool: not above it
        (at(2026, 9, 2, 10, 20), glm, prod, PREFILL_POOL_TOKENS + 1, {}),
        (at(2026, 9, 4, 9, 30), scout, prod, 900_000, {}),  # another model
        (at(2026, 9, 9, 23, 59, 59), glm, prod, 800_000, {}),  # the window's last second
        (at(2026, 9, 10, 0, 0, 0), glm, prod, 800_000, {}),  # the day after
        (at(2026, 8, 20, 8), llama, dev, 2_400, {"timestamp": "2026-08-20T08:00:00"}),  # the zone left off
        (at(2026, 9, 9, 23, 30), glm, prod, 750_000, {"timestamp": "2026-09-10T01:30:00+02:00"}),  # local time
        (at(2026, 8, 18, 11, 5), qwen, prod, 1_500, {"prompt_tokens": "1500"}),  # a count stored as text
    ]
    lines = [(when, _dump(simulate_call(rng, when, model, account, tokens) | written))
             for when, model, account, tokens, written in calls]
    crashed = at(2026, 8, 14, 16, 2)
    lines.append((crashed, _dump(simulate_call(rng, crashed, qwen, prod, 900))[:60]))  # a crash mid-write
    return sorted(lines, key=lambda pair: pair[0])


def generate_rows(rows: int, seed: int = 0) -> Iterator[str]:
    """`rows` JSON lines in time order from `seed`; from 1,000 rows on, the special lines among them."""
    rng = random.Random(seed)
    specials = _special_lines(rng) if rows >= 1_000 else []
    ordinary = rows - len(specials)
    span_s = (LOG_END - LOG_START).total_seconds()
    k = 0
    for i in range(ordinary):
        when = LOG_START + timedelta(seconds=int((i + rng.random()) / ordinary * span_s))
        while k < len(specials) and specials[k][0] <= when:
            yield specials[k][1]
            k += 1
        yield _dump(_ordinary_call(rng, when))
    yield from (line for _, line in specials[k:])


def write_gateway_log(path: str | Path, rows: int = DEFAULT_ROWS, seed: int = 0) -> int:
    """Write a synthetic log (gzip when the name ends in .gz); the lines written. Same seed, same bytes."""
    path, written = Path(path), 0
    with open(path, "wb") as raw:
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if path.suffix == ".gz" else None
        with io.TextIOWrapper(gz or raw, encoding="utf-8", newline="\n") as out:  # the gzip bytes depend on these writes
            for written, line in enumerate(generate_rows(rows, seed), start=1):
                out.write(line + "\n")
    return written


def add_make_logs_arguments(parser: argparse.ArgumentParser) -> None:
    """`make-logs OUT [--rows N] [--seed S]`."""
    parser.add_argument("out", metavar="OUT", help="file to write; a name ending in .gz is compressed")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"lines to write (default {DEFAULT_ROWS:,})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0: the shipped log)")


def run_make_logs(args: argparse.Namespace) -> int:
    """Write the log the arguments ask for; 0 on success, 2 with a one-line error otherwise."""
    if args.rows < 0:
        print(f"error: --rows must be 0 or more, got {args.rows}", file=sys.stderr)
        return 2
    try:
        written = write_gateway_log(args.out, rows=args.rows, seed=args.seed)
    except OSError as e:
        print(f"error: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {written:,} lines to {args.out} (seed {args.seed})")
    return 0
