"""Checkers for notebook 08 (detection and response), on small gateway logs whose answer is known by
construction (which reply was stored, which text holds a record number, which calls leaked)."""

import random
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable

from minikv.exercises import expect
from minikv.logs.gateway_log import INCIDENT_MODEL, OUTAGE_START, GatewayRecord
from minikv.logs.scan import Signals, scan_records, secret_shapes

DAY = datetime(2026, 9, 1, 12, tzinfo=timezone.utc)  # inside the window, before the outage


def _record(i: int, status: int = 200, text: str = "summary of clause 4.", prompt_tokens: int = 700_000,
            ttft_ms: float = 30_000.0, when: datetime = DAY,
            account: str = "northwind-legal") -> GatewayRecord:
    completion = len(text.split()) if status == 200 else 0
    return GatewayRecord(i, when + timedelta(minutes=i), f"req-{i:04d}", account, INCIDENT_MODEL,
                         prompt_tokens,
                         completion, ttft_ms, status, text)


def _unreviewable_cases(seed: int) -> tuple[list[GatewayRecord], set[str]]:
    """A checklist set mixing stored replies, unstored 200s, and failures that returned nothing."""
    rng = random.Random(seed)
    records, unstored = [], set()
    for i in range(rng.randint(6, 14)):
        kind = rng.choice(["stored", "unstored", "failed", "failed-with-text"])
        if kind == "stored":
            text = rng.choice(["saved nothing.", "the indemnity clause is standard."])
            records.append(_record(i, text=text))
        elif kind == "unstored":
            records.append(_record(i, text="", account="northwind-batch"))
            unstored.add(records[-1].request_id)
        elif kind == "failed":
            records.append(_record(i, status=rng.choice([500, 503]), text=""))
        else:
            records.append(_record(i, status=503, text="service unavailable"))
    return records, unstored


def check_unreviewable(fn: Callable[[list[GatewayRecord]], Iterable[str]]) -> None:
    """fn(records in the checklist's set) -> the set of request ids of replies that came back 200 but were
    never stored."""
    for seed in range(5):
        records, want = _unreviewable_cases(seed)
        got = fn(list(records))
        assert isinstance(got, (set, frozenset)), (
            f"generated set #{seed}: expected a set of request ids, got {type(got).__name__} {got!r}. "
            "A set has no order and no repeats, and the next cell compares it with the checklist's set.")
        expect(got, want, f"generated set #{seed} of {len(records)} calls", "A reply that came back (status "
               "200) with no stored text can never be reviewed; a failed call returned nothing to review.")
    print("Correct on 5 generated sets: treat every unstored 200 in the set as exposed.")


def _mrn_texts(seed: int) -> list[tuple[str, bool]]:
    """(reply text, holds a medical record number?): MRN, a space, exactly eight digits, as a word."""
    rng = random.Random(seed)

    def digits(n: int) -> str:
        return "".join(rng.choice("0123456789") for _ in range(n))

    texts = []
    for _ in range(4):
        d8 = digits(8)
        texts += [(f"MRN {d8}", True), (f"Patient file, MRN {d8}.", True), (f"(MRN {d8}) ward 3", True),
                  (f"MRN {digits(7)}", False), (f"MRN {digits(9)}", False), (f"XMRN {d8}", False),
                  (f"mrn {d8}", False), (f"Patient {d8}", False), (f"card {d8}", False), (d8, False),
                  (f"MRN {d8[:4]} {d8[4:]}", False), ("saved nothing.", False)]
    return texts


def check_mrn_pattern(pattern: str) -> None:
    """pattern: a regular expression that, given to Signals(patterns=...), flags replies holding an MRN."""
    assert isinstance(pattern, str), f"expected a regular expression as a string, got {pattern!r}"
    compiled = Signals(patterns=(pattern,)).compiled
    texts = _mrn_texts(8)
    for text, holds in texts:
        got = f"pattern:{pattern}" in secret_shapes(text, compiled)
        expect(got, holds, f"reply {text!r}: flagged", "A record number is the word MRN, one space, and "
               "exactly eight digits, with no letter or digit glued to either end.")
    print(f"Correct on {len(texts)} replies, near misses included.")


def _ceiling_log(seed: int) -> tuple[list[GatewayRecord], set[str]]:
    """Honest calls and leaked ones (too fast for their prompt), on a scale that changes with the seed."""
    rng = random.Random(seed)
    scale = 10 ** rng.randint(3, 6)  # healthy servers read about this many tokens a second
    records, in_set = [], set()
    for i in range(40):  # honest calls, some of them prefix-cache hits up to 20x faster
        tokens = rng.randint(2_000, 600_000)
        rate = scale * rng.uniform(0.5, 20.0 if rng.random() < 0.2 else 3.0)
        records.append(_record(i, prompt_tokens=tokens, ttft_ms=1000 * tokens / rate))
    for i in range(40, 48):  # leaked: answered at least 100x faster than any honest call
        tokens = rng.randint(681_281, 1_000_000)
        rate = scale * rng.uniform(2_000, 50_000)
        records.append(_record(i, prompt_tokens=tokens, ttft_ms=1000 * tokens / rate))
        in_set.add(records[-1].request_id)
    late = _record(48, prompt_tokens=900_000, ttft_ms=80_000, when=OUTAGE_START + timedelta(hours=7))
    records.append(late)  # in the set, served after the fix: slow, as it should be
    in_set.add(late.request_id)
    return records, in_set


def check_ceiling(fn: Callable[[list[GatewayRecord], set[str], datetime], float]) -> None:
    """fn(records, ids in the checklist's set, outage start) -> a prefill-rate ceiling for the TTFT signal
    that flags every call in the set that came back 200 before the outage, and nothing outside the set."""
    for seed in range(5):
        records, in_set = _ceiling_log(seed)
        ceiling = fn(list(records), set(in_set), OUTAGE_START)
        assert isinstance(ceiling, (int, float)) and ceiling > 0, \
            f"expected a positive number, got {ceiling!r}"
        flags = scan_records(records, signals=Signals(max_prefill_tokens_per_s=ceiling)).flags
        fast = {f.record.request_id for f in flags if "ttft_anomaly" in f.reasons}
        leaked = {r.request_id for r in records if r.request_id in in_set and r.timestamp < OUTAGE_START}
        where = f"log #{seed}, ceiling {ceiling:,.0f} tokens/s"
        expect(sorted(leaked - fast), [], f"{where}: calls in the set not flagged",
               "Lower the ceiling below the slowest of them.")
        expect(sorted(fast - in_set), [], f"{where}: calls outside the set flagged",
               "Raise the ceiling above the fastest honest call.")
    print("Correct on 5 generated logs, each at its own speed.")
