"""Scan a gateway log for the calls the disclosure names (the checklist *defines* affected) and for two
warning signs in every call, leads for a person to follow; only findings are kept (docs/logs.md)."""

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from http import HTTPStatus
from pathlib import Path

from minikv.logs.ceiling import LearnedCeiling, group_label
from minikv.logs.gateway_log import (INCIDENT_FIRST_DAY, INCIDENT_LAST_DAY, INCIDENT_MODEL, PREFILL_POOL_TOKENS,
                                     GatewayRecord, MalformedLine, iter_log)
from minikv.logs.line_reader import LogReadError, TruncatedLog, source_name
from minikv.logs.luhn import luhn_ok

# Generous on purpose (healthy servers in the shipped log read 9,000-45,000); a prefix-cache hit may beat it. The
# command line learns the ceiling from the log instead (ceiling.py) unless given one; this is then the fallback.
DEFAULT_MAX_PREFILL_TOKENS_PER_S = 100_000.0
CARD_NUMBER = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")  # then a Luhn check
API_KEY = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36}|xox[abpr]-[A-Za-z0-9-]{10,})"
    r"|(?i:\b(?:api[_-]?key|secret[_-]?key|access[_-]?token)\b\s*[:=]\s*\S{8,})"
)
EMAIL_ADDRESS = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
MAX_MALFORMED_SHOWN = 20  # in the text report
MAX_MALFORMED_KEPT = 1_000  # in memory and in --json; the rest are only counted


@dataclass(frozen=True)
class Checklist:
    """The disclosure's test for 'possibly affected': model, UTC days (inclusive), prompt size."""
    model: str = INCIDENT_MODEL
    first_day: date = INCIDENT_FIRST_DAY
    last_day: date = INCIDENT_LAST_DAY
    min_prompt_tokens: int = PREFILL_POOL_TOKENS  # affected means strictly above this

    def __post_init__(self) -> None:
        if self.first_day > self.last_day:
            raise ValueError(f"the window starts on {self.first_day} after it ends on {self.last_day}")
        if self.min_prompt_tokens < 0:
            raise ValueError(f"the prompt-token threshold must be 0 or more, got {self.min_prompt_tokens}")

    def matches(self, record: GatewayRecord) -> bool:
        """Is this call in the checklist's set? (its timestamp is already in UTC)"""
        return (record.model == self.model and self.first_day <= record.timestamp.date() <= self.last_day
                and record.prompt_tokens > self.min_prompt_tokens)


@dataclass(frozen=True)
class Signals:
    """The two warning signs checked on every row, with the settings a user can change. A prefill-rate
    ceiling of None is learned from the log itself (ceiling.py)."""
    max_prefill_tokens_per_s: float | None = DEFAULT_MAX_PREFILL_TOKENS_PER_S
    patterns: tuple[str, ...] = ()  # extra regular expressions that mark data as not yours
    compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_prefill_tokens_per_s is not None and not self.max_prefill_tokens_per_s > 0:
            raise ValueError(f"the prefill-rate ceiling must be above 0, got {self.max_prefill_tokens_per_s}")
        compiled = []
        for pattern in self.patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as e:
                raise ValueError(f"pattern {pattern!r} is not a regular expression: {e}") from None
        object.__setattr__(self, "compiled", tuple(compiled))


def implied_prefill_rate(record: GatewayRecord) -> float | None:
    """Prompt tokens per second of time to first token; None when no token came back."""
    if record.status >= HTTPStatus.BAD_REQUEST or record.completion_tokens == 0:
        return None
    if record.ttft_ms == 0:
        return math.inf if record.prompt_tokens else 0.0
    return record.prompt_tokens / (record.ttft_ms / 1000)


def secret_shapes(text: str, extra: Sequence[re.Pattern[str]] = ()) -> list[str]:
    """Reasons to think `text` carries someone's secret: card numbers, API keys, e-mail, extras."""
    found = {"card_number": any(luhn_ok(re.sub(r"\D", "", m.group())) for m in CARD_NUMBER.finditer(text)),
             "api_key": API_KEY.search(text), "email_address": EMAIL_ADDRESS.search(text)}
    return [reason for reason, hit in found.items() if hit] + [f"pattern:{p.pattern}" for p in extra if p.search(text)]


def flag_reasons(record: GatewayRecord, signals: Signals) -> list[str]:
    """Every warning sign this row shows, in a fixed order; empty when it shows none. With a learned
    ceiling the first sign is decided once the whole log is read (`scan_records`)."""
    rate, ceiling = implied_prefill_rate(record), signals.max_prefill_tokens_per_s
    reasons = ["ttft_anomaly"] if rate is not None and ceiling is not None and rate > ceiling else []
    return reasons + (secret_shapes(record.response_text, signals.compiled) if record.response_text else [])


@dataclass(frozen=True)
class Flag:
    """A row that showed at least one warning sign."""
    record: GatewayRecord
    reasons: list[str]


@dataclass
class ScanResult:
    """What a scan found. Only findings are kept, never the whole log."""
    scanned: int = 0  # non-blank lines read, well-formed or not
    malformed: list[MalformedLine] = field(default_factory=list)  # the first MAX_MALFORMED_KEPT
    malformed_count: int = 0  # all of them
    read_error: str | None = None  # why the log stopped before its end; None when read whole
    affected: list[GatewayRecord] = field(default_factory=list)  # the checklist's set, in file order
    flags: list[Flag] = field(default_factory=list)
    zoneless: int = 0  # timestamps with no zone, read as UTC
    first_zoneless_line: int | None = None
    ceilings: dict[str, float | None] = field(default_factory=dict)  # learned, by prompt-size group; None: fallback
    unlisted_fast: int = 0  # rows above a learned ceiling beyond those kept to list

    @property
    def affected_ids(self) -> list[str]:
        return [r.request_id for r in self.affected]

    def to_json(self) -> dict:
        """The `--json` shape (malformed: the first ones kept; read_error: null when read to the end)."""
        return {"scanned": self.scanned, "malformed": [{"line": m.line, "error": m.error} for m in self.malformed],
                "affected": self.affected_ids,
                "flags": [{"request_id": f.record.request_id, "reasons": f.reasons} for f in self.flags],
                "malformed_count": self.malformed_count, "read_error": self.read_error}

    def zone_note(self) -> str | None:
        """The note that timestamps without a zone were read as UTC, or None."""
        if not self.zoneless:
            return None
        had = "1 timestamp had" if self.zoneless == 1 else f"{self.zoneless:,} timestamps had"
        return f"note: {had} no time zone; read as UTC (first at line {self.first_zoneless_line})"


def scan_records(items: Iterable[GatewayRecord | MalformedLine], checklist: Checklist = Checklist(),
                 signals: Signals = Signals(), max_malformed_kept: int = MAX_MALFORMED_KEPT) -> ScanResult:
    """Apply the checklist and the signals to a stream of parsed lines. A stream that breaks off
    (TruncatedLog) ends the scan: what was read stays, and `read_error` says where it stopped."""
    result = ScanResult()
    learned = LearnedCeiling(DEFAULT_MAX_PREFILL_TOKENS_PER_S) if signals.max_prefill_tokens_per_s is None else None
    try:
        for item in items:
            result.scanned += 1
            if isinstance(item, MalformedLine):
                result.malformed_count += 1
                if len(result.malformed) < max_malformed_kept:
                    result.malformed.append(item)
                continue
            if item.zone_assumed:
                result.zoneless += 1
                result.first_zoneless_line = result.first_zoneless_line or item.line
            if checklist.matches(item):
                result.affected.append(item)
            if learned is not None and (rate := implied_prefill_rate(item)) is not None:
                learned.add(item, rate)
            if reasons := flag_reasons(item, signals):
                result.flags.append(Flag(item, reasons))
    except TruncatedLog as e:
        result.read_error = str(e)
    if learned is not None:
        _add_learned_flags(result, learned)
    return result


def _add_learned_flags(result: ScanResult, learned: LearnedCeiling) -> None:
    """The rows above their learned ceiling join the flags, first reason `ttft_anomaly`, in file order."""
    fast, result.unlisted_fast = learned.outliers()
    result.ceilings = {group_label(g): c for g, c in learned.ceilings().items()}
    by_line = {f.record.line: f for f in result.flags}
    for record in fast:
        flag = by_line.get(record.line)
        by_line[record.line] = Flag(flag.record if flag else record, ["ttft_anomaly", *(flag.reasons if flag else [])])
    result.flags = [by_line[line] for line in sorted(by_line)]


def scan_log(path: str | Path, checklist: Checklist = Checklist(), signals: Signals = Signals()) -> ScanResult:
    """Scan a log (a file or '-' for stdin, plain or gzip); raises LogReadError if it cannot be opened."""
    return scan_records(iter_log(path), checklist, signals)


def format_report(result: ScanResult, checklist: Checklist, signals: Signals, source: str) -> str:
    """The plain-text report `scan-logs` prints."""
    ok = result.scanned - result.malformed_count
    lines = [f"Scanned {result.scanned:,} lines of {source}: {ok:,} records, {result.malformed_count:,} malformed.",
             f"Checklist: model {checklist.model}, UTC days {checklist.first_day} to {checklist.last_day}"
             f" (both included), prompt_tokens above {checklist.min_prompt_tokens:,}.",
             f"Affected (the checklist's set): {len(result.affected):,} calls"]
    lines += [f"  line {r.line}  {r.timestamp:%Y-%m-%dT%H:%M:%SZ}  {r.request_id}  {r.account}  prompt_tokens="
              f"{r.prompt_tokens:,}  ttft_ms={r.ttft_ms:,.1f}  status={r.status}" for r in result.affected]
    ceiling, learned = _ceiling_lines(result, signals)
    lines.append(f"Flagged by the signals: {len(result.flags):,} rows (prefill ceiling {ceiling}; secret-shaped text)")
    lines += [f"  line {f.record.line}  {f.record.request_id}  {', '.join(f.reasons)}" for f in result.flags]
    if result.unlisted_fast:
        lines.append(f"  ... and {result.unlisted_fast:,} more rows above a learned ceiling, not listed")
    lines += learned
    if result.malformed:
        lines.append("Malformed lines (skipped):")
        lines += [f"  line {m.line}: {m.error}" for m in result.malformed[:MAX_MALFORMED_SHOWN]]
        if result.malformed_count > MAX_MALFORMED_SHOWN:
            lines.append(f"  ... and {result.malformed_count - MAX_MALFORMED_SHOWN:,} more"
                         f" (--json lists the first {len(result.malformed):,})")
    if result.zone_note():
        lines.append(result.zone_note())
    if result.read_error:
        lines.append(f"Incomplete: {result.read_error}; the lines after it were not scanned.")
    return "\n".join(lines)


def _ceiling_lines(result: ScanResult, signals: Signals) -> tuple[str, list[str]]:
    """The ceiling as the report states it: fixed, or learned with a line per model and prompt size."""
    if signals.max_prefill_tokens_per_s is not None:
        return f"{signals.max_prefill_tokens_per_s:,.0f} tokens/s", []
    fallback = f"{DEFAULT_MAX_PREFILL_TOKENS_PER_S:,.0f} (too few rows to learn from)"
    return "learned from the log, below", ["Prefill ceilings learned from the log (tokens/s):"] + [
        f"  {label}: {fallback if c is None else f'{c:,.0f}'}" for label, c in result.ceilings.items()]


def add_scan_logs_arguments(parser: argparse.ArgumentParser) -> None:
    """`scan-logs FILE [options]`, values kept as strings: `run_scan_logs` checks them, in one line."""
    add = parser.add_argument
    add("file", metavar="FILE", help="gateway log, JSON Lines, plain or gzip; - reads stdin")
    add("--model", default=INCIDENT_MODEL, help="model id (default %(default)s)")
    add("--since", default=str(INCIDENT_FIRST_DAY), metavar="DATE", help="first UTC day, YYYY-MM-DD (default %(default)s)")
    add("--until", default=str(INCIDENT_LAST_DAY), metavar="DATE", help="last UTC day, included (default %(default)s)")
    add("--min-prompt-tokens", default=str(PREFILL_POOL_TOKENS), metavar="N",
        help="affected means prompt_tokens strictly above N (default %(default)s)")
    add("--max-prefill-rate", metavar="TOKENS_PER_S", help="flag replies faster than this prompt tokens per second of "
        "TTFT (default: learned from the log, each prompt size against its own; docs/logs.md)")
    add("--pattern", action="append", default=[], metavar="REGEX", help="also flag replies matching REGEX (repeatable)")
    add("--json", action="store_true", help="print one JSON object instead of the text report")


def _parse(option: str, text: str, kind: type[date] | type[int] | type[float]) -> date | int | float:
    """`text` as a YYYY-MM-DD day or a number (100,000 and 100_000 too); else a ValueError naming `option`."""
    try:
        return date.fromisoformat(text) if kind is date else kind(text.replace(",", "").replace("_", ""))
    except ValueError:
        want = {date: "a date: want YYYY-MM-DD, e.g. 2026-08-27", int: "a whole number", float: "a number"}[kind]
        raise ValueError(f"{option} {text!r} is not {want}") from None


def _print(text: str, stream=None) -> None:
    """Print, and go quiet if the reader left (`scan-logs ... | head`)."""
    stream = stream or sys.stdout
    try:
        print(text, file=stream)
        stream.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def run_scan_logs(args: argparse.Namespace) -> int:
    """Scan and print; exit status 0 nothing found, 1 findings to review, 2 could not scan it all."""
    try:
        checklist = Checklist(args.model, _parse("--since", args.since, date), _parse("--until", args.until, date),
                              _parse("--min-prompt-tokens", args.min_prompt_tokens, int))
        ceiling = None if args.max_prefill_rate is None else _parse("--max-prefill-rate", args.max_prefill_rate, float)
        signals = Signals(ceiling, tuple(args.pattern))
        result = scan_log(args.file, checklist, signals)
    except (ValueError, LogReadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        _print(json.dumps(result.to_json(), indent=2))
        if result.zone_note():
            _print(result.zone_note(), sys.stderr)
    else:
        _print(format_report(result, checklist, signals, source_name(args.file)))
    if result.read_error:
        print(f"error: {result.read_error}; the report covers the lines before it", file=sys.stderr)
        return 2
    return 1 if result.affected or result.flags or result.malformed_count else 0
