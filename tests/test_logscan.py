"""The gateway-log scanner: the disclosure's checklist, the two signals, and bad input."""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tracemalloc
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv.logs.gateway_log import (
    INCIDENT_MODEL,
    SHIPPED_LOG,
    GatewayRecord,
    MalformedLine,
    add_make_logs_arguments,
    generate_rows,
    leaked,
    parse_lines,
    run_make_logs,
    write_gateway_log,
)
from minikv.logs.line_reader import LogReadError, OverlongLine, read_lines
from minikv.logs.luhn import luhn_check_digit, luhn_ok
from minikv.logs.scan import (
    Checklist,
    Signals,
    add_scan_logs_arguments,
    implied_prefill_rate,
    run_scan_logs,
    scan_log,
    scan_records,
    secret_shapes,
)

VISA_TEST_CARD = "4111 1111 1111 1111"  # passes the Luhn check


def row(**fields: object) -> dict:
    """A well-formed, affected call; keyword arguments replace fields."""
    base = {
        "timestamp": "2026-09-01T12:00:00Z", "request_id": "req_1", "account": "acme",
        "model": INCIDENT_MODEL, "prompt_tokens": 700_000, "completion_tokens": 120,
        "ttft_ms": 70_000.0, "status": 200, "response_text": "Clause 4 caps liability.",
    }
    return base | fields


def scan(*rows: dict | str, **checklist: object):
    """Scan rows given as dicts (dumped to JSON) or raw lines, with the default signals."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    return scan_records(parse_lines(lines), Checklist(**checklist))


def affected(timestamp: str, **fields: object) -> bool:
    return bool(scan(row(timestamp=timestamp, **fields)).affected)


# --- the checklist's boundaries ----------------------------------------------------------


def test_first_second_of_the_window_is_affected():
    """A call at 2026-08-27T00:00:00Z is inside the window."""
    assert affected("2026-08-27T00:00:00Z")


def test_last_second_of_the_window_is_affected():
    """A call at 2026-09-09T23:59:59Z is inside: the last day counts whole."""
    assert affected("2026-09-09T23:59:59.999999Z")


def test_day_before_the_window_is_not_affected():
    """2026-08-26T23:59:59Z is one second too early."""
    assert not affected("2026-08-26T23:59:59Z")


def test_day_after_the_window_is_not_affected():
    """2026-09-10T00:00:00Z is one second too late."""
    assert not affected("2026-09-10T00:00:00Z")


def test_exactly_the_pool_size_is_not_affected():
    """681,280 prompt tokens fit the pool; the checklist means strictly above it."""
    assert not scan(row(prompt_tokens=681_280)).affected
    assert scan(row(prompt_tokens=681_281)).affected


def test_other_models_are_not_affected():
    """Same window and size on any other model id (even a near miss) is not in the set."""
    for model in ("@cf/meta/llama-4-scout-17b-16e-instruct", "@cf/zai-org/glm-5.3-fast", "@CF/ZAI-ORG/GLM-5.3"):
        assert not scan(row(model=model)).affected, model


def test_zoneless_timestamps_are_read_as_utc():
    """No zone means UTC: 23:30 on the last day is in, 23:30 the day before the window is out."""
    result = scan(row(timestamp="2026-09-09T23:30:00"), row(timestamp="2026-08-26T23:30:00", request_id="r2"))
    assert result.affected_ids == ["req_1"]
    assert result.zoneless == 2 and result.first_zoneless_line == 1


def test_offsets_are_converted_to_utc_before_taking_the_day():
    """01:30+02:00 on 10 September is 9 September in UTC; 01:00+02:00 on 27 August is 26 August."""
    assert affected("2026-09-10T01:30:00+02:00")
    assert not affected("2026-08-27T01:00:00+02:00")
    assert affected("2026-08-26T22:00:00-03:00")  # 01:00 UTC on 27 August


def test_checklist_ignores_status_and_timing():
    """The set is model, window and size only: a 503 or a slow reply still belongs to it."""
    assert scan(row(status=503, completion_tokens=0, response_text="")).affected


def test_checklist_rejects_a_window_that_ends_before_it_starts():
    """first_day after last_day is a configuration error, named with both dates."""
    with pytest.raises(ValueError, match="2026-09-09.*2026-08-27"):
        Checklist(first_day=date(2026, 9, 9), last_day=date(2026, 8, 27))


# --- the two signals ---------------------------------------------------------------------


def test_ttft_anomaly_flags_a_reply_too_fast_for_its_prompt():
    """700,000 tokens in 250 ms is 2.8 million tokens/s: flagged; in 70 s it is not."""
    fast, slow = row(ttft_ms=250.0), row(ttft_ms=70_000.0, request_id="r2")
    assert [f.reasons for f in scan(fast, slow).flags] == [["ttft_anomaly"]]
    assert implied_prefill_rate(scan(fast).affected[0]) == pytest.approx(2_800_000)


def test_ttft_ceiling_is_a_setting():
    """Raising the ceiling above the implied rate silences the signal."""
    record = scan(row(ttft_ms=250.0)).affected[0]
    result = scan_records([record], signals=Signals(max_prefill_tokens_per_s=3_000_000))
    assert result.flags == []


def test_no_ttft_signal_without_a_first_token():
    """An error or an empty reply has no first token, so no prefill rate to judge."""
    assert scan(row(ttft_ms=20.0, status=503, completion_tokens=0, response_text="")).flags == []
    assert implied_prefill_rate(scan(row(completion_tokens=0)).affected[0]) is None


def test_secret_shaped_strings_are_flagged():
    """Card numbers (Luhn-valid), API keys and e-mail addresses each give their reason."""
    assert secret_shapes(f"card {VISA_TEST_CARD} exp 09/29") == ["card_number"]
    assert secret_shapes("card 4111 1111 1111 1112") == []  # fails the Luhn check
    assert secret_shapes("export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx") == ["api_key"]
    assert secret_shapes("aws_access_key_id = AKIAABCDEFGHIJKLMNOP") == ["api_key"]
    assert secret_shapes("mail dana.whitfield@globex.example today") == ["email_address"]
    assert secret_shapes("Clause 14 caps liability at 12 months of fees.") == []


def test_user_patterns_are_flagged_by_name():
    """A pattern the user supplies becomes a reason 'pattern:<regex>'."""
    signals = Signals(patterns=(r"MRN \d{8}",))
    result = scan_records(parse_lines([json.dumps(row(response_text="Patient MRN 12345678"))]), signals=signals)
    assert result.flags[0].reasons == [r"pattern:MRN \d{8}"]


def test_a_bad_user_pattern_is_a_clear_error():
    """An invalid regular expression is refused when the signals are built."""
    with pytest.raises(ValueError, match="not a regular expression"):
        Signals(patterns=("([",))


def test_luhn_check_on_known_numbers():
    """The Luhn check accepts test card numbers and rejects a changed digit."""
    assert luhn_ok("4111111111111111") and luhn_ok("5500005555555559")
    assert not luhn_ok("4111111111111112") and not luhn_ok("1234")


def test_luhn_check_digit_completes_known_numbers():
    """The check digit of a test card's first 15 digits is its 16th, and the result passes."""
    assert luhn_check_digit("411111111111111") == 1 and luhn_check_digit("550000555555555") == 9
    for payload in ("4" + "0" * 14, "4" + "9" * 14, "401288888888188"):
        assert luhn_ok(payload + str(luhn_check_digit(payload)))


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, error",
    [
        ('{"timestamp": "2026-09-01T12:00:00Z", "reque', "not JSON"),
        ("[1, 2, 3]", "not a JSON object"),
        (json.dumps({k: v for k, v in row().items() if k != "ttft_ms"}), "missing field 'ttft_ms'"),
        (json.dumps(row(prompt_tokens="700000")), "'prompt_tokens' should be an integer, got str"),
        (json.dumps(row(prompt_tokens=700_000.5)), "'prompt_tokens' should be a whole number, got 700000.5"),
        (json.dumps(row(prompt_tokens=float("inf"))), "'prompt_tokens' should be a whole number"),
        (json.dumps(row(completion_tokens=1e300)), "'completion_tokens' should be a count"),
        (json.dumps(row(completion_tokens=True)), "'completion_tokens' should be an integer, got bool"),
        (json.dumps(row(prompt_tokens=-1)), "'prompt_tokens' should be a count"),
        (json.dumps(row(ttft_ms=float("nan"))), "'ttft_ms' should be a finite number"),
        (json.dumps(row(status=200.0)), "'status' should be an integer"),
        (json.dumps(row(status=1000)), "'status' should be an HTTP status"),
        (json.dumps(row(timestamp="2026-13-01T00:00:00Z")), "bad timestamp"),
        (json.dumps(row(timestamp="yesterday")), "bad timestamp"),
        (json.dumps(row(timestamp=1_788_000_000)), "'timestamp' should be a string"),
    ],
)
def test_malformed_lines_are_reported_and_skipped(line: str, error: str):
    """Each kind of bad line is listed with its line number and reason; good lines still count."""
    result = scan(row(), line, row(request_id="req_3"))
    assert result.scanned == 3
    assert [(m.line, error in m.error) for m in result.malformed] == [(2, True)], result.malformed
    assert result.affected_ids == ["req_1", "req_3"]


def test_bytes_that_are_not_utf8_are_a_malformed_line():
    """A line of invalid UTF-8 is reported, not decoded with a crash."""
    items = list(parse_lines([json.dumps(row()).encode(), b"\xff\xfe{", b"\n"]))
    assert isinstance(items[0], GatewayRecord)
    assert items[1] == MalformedLine(2, "not UTF-8 text")
    assert len(items) == 2  # the blank line is skipped


def test_blank_lines_are_skipped_but_keep_line_numbers(tmp_path: Path):
    """Blank lines are neither scanned nor malformed; later line numbers stay physical."""
    path = tmp_path / "log.jsonl"
    path.write_text("\n" + json.dumps(row()) + "\n\n   \nnot json\n")
    result = scan_log(path)
    assert result.scanned == 2
    assert result.affected[0].line == 2 and result.malformed[0].line == 5


def test_an_empty_file_scans_nothing(tmp_path: Path):
    """An empty log is a valid, empty scan."""
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert scan_log(tmp_path / "empty.jsonl").to_json() == {
        "scanned": 0, "malformed": [], "affected": [], "flags": [], "malformed_count": 0, "read_error": None}


def test_a_missing_file_is_a_log_read_error(tmp_path: Path):
    """A path that does not exist raises LogReadError naming it."""
    with pytest.raises(LogReadError, match="no such file"):
        scan_log(tmp_path / "nope.jsonl")


def test_a_gzip_log_reads_like_the_plain_one(tmp_path: Path):
    """gzip is recognised by its magic bytes, whatever the file is called."""
    text = "\n".join(json.dumps(row(request_id=f"r{i}", prompt_tokens=681_279 + i)) for i in range(4)) + "\n"
    (tmp_path / "plain.jsonl").write_text(text)
    (tmp_path / "packed.log").write_bytes(gzip.compress(text.encode()))
    assert scan_log(tmp_path / "packed.log").to_json() == scan_log(tmp_path / "plain.jsonl").to_json()
    assert scan_log(tmp_path / "packed.log").affected_ids == ["r2", "r3"]


def test_an_integral_float_count_is_a_count():
    """681281.0 prompt tokens is the whole number 681,281: a record, and affected."""
    result = scan(row(prompt_tokens=681_281.0, completion_tokens=120.0))
    assert result.malformed == [] and result.affected_ids == ["req_1"]
    assert result.affected[0].prompt_tokens == 681_281 and type(result.affected[0].prompt_tokens) is int


def numbered_log(rows: int) -> bytes:
    """`rows` affected lines whose request ids are r1, r2, ... (line i holds r<i>)."""
    return ("".join(json.dumps(row(request_id=f"r{i}")) + "\n" for i in range(1, rows + 1))).encode()


def test_a_truncated_gzip_is_scanned_up_to_the_cut(tmp_path: Path):
    """A gzip stream cut short keeps every row before the cut and says where it stopped."""
    text = numbered_log(5_000)
    packed = gzip.compress(text)
    (tmp_path / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    result = scan_log(tmp_path / "cut.jsonl.gz")
    assert result.read_error and "breaks off after line" in result.read_error
    assert 1_000 < len(result.affected) < 5_000
    assert result.affected_ids == [f"r{i}" for i in range(1, len(result.affected) + 1)]
    assert result.scanned - len(result.affected) <= 1  # at most the half line at the cut


def test_trailing_garbage_after_a_gzip_keeps_every_row(tmp_path: Path):
    """Bytes after the last gzip member do not cost a single row; the error is still reported."""
    (tmp_path / "tail.jsonl.gz").write_bytes(gzip.compress(numbered_log(3_000)) + b"garbage after the end")
    result = scan_log(tmp_path / "tail.jsonl.gz")
    assert result.affected_ids == [f"r{i}" for i in range(1, 3_001)] and result.malformed_count == 0
    assert "Not a gzipped file" in result.read_error


def test_a_corrupt_gzip_block_keeps_the_rows_before_it(tmp_path: Path):
    """Zeroed bytes mid-stream end the scan with an error; the rows before them are all kept.

    (Rows decoded between the damage and its detection may be garbled: the error says so.)
    """
    packed = bytearray(gzip.compress(numbered_log(5_000)))
    packed[len(packed) // 2 : len(packed) // 2 + 64] = bytes(64)  # about row 2,500
    (tmp_path / "bad.jsonl.gz").write_bytes(bytes(packed))
    result = scan_log(tmp_path / "bad.jsonl.gz")
    assert result.read_error and "breaks off" in result.read_error
    assert result.affected_ids[:2_000] == [f"r{i}" for i in range(1, 2_001)]


def test_malformed_lines_are_kept_up_to_a_cap_and_counted_beyond_it():
    """Only the first N malformed lines are held (with their line numbers); all are counted."""
    lines = [json.dumps(row(request_id="r1"))] + ["not json"] * 50 + [json.dumps(row(request_id="r2"))]
    result = scan_records(parse_lines(lines), max_malformed_kept=7)
    assert [m.line for m in result.malformed] == list(range(2, 9))
    assert result.malformed_count == 50 and result.scanned == 52
    assert result.affected_ids == ["r1", "r2"]
    assert result.to_json()["malformed_count"] == 50 and len(result.to_json()["malformed"]) == 7


def test_an_overlong_line_is_one_malformed_line_of_its_length():
    """A line past the limit is skipped as one malformed line; its neighbours are read."""
    class Chunks:  # a stream that hands out a few bytes at a time, like a pipe
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read1(self, n: int) -> bytes:
            piece, self.data = self.data[:5], self.data[5:]
            return piece

    data = b'{"a":1}\n' + b"x" * 40 + b"\nshort\n" + b"y" * 41
    lines = list(read_lines(Chunks(data), "test", max_line_bytes=30))  # type: ignore[arg-type]
    assert lines == [b'{"a":1}', OverlongLine(40), b"short", OverlongLine(41)]
    items = list(parse_lines(lines))
    assert items[1] == MalformedLine(2, "a line of 40 bytes: too long to be a record, skipped")


# --- the property: affected is exactly the checklist's set ----------------------------------

TEST_MODELS = (INCIDENT_MODEL, "@cf/zai-org/glm-5.3-fast", "@cf/meta/llama-4-scout-17b-16e-instruct")
ZONES = {"": timedelta(0), "Z": timedelta(0), "+00:00": timedelta(0), "+02:00": timedelta(hours=2),
         "-05:30": timedelta(hours=-5, minutes=-30), "+14:00": timedelta(hours=14)}
BAD_LINES = ("not json", "{}", "[]", json.dumps(row(prompt_tokens="9")), json.dumps(row(timestamp="2026-02-30T00:00:00Z")))

random_rows = st.lists(
    st.one_of(
        st.tuples(
            st.datetimes(min_value=datetime(2026, 8, 20), max_value=datetime(2026, 9, 16)),
            st.sampled_from(sorted(ZONES)),
            st.sampled_from(TEST_MODELS),
            st.one_of(st.integers(0, 1_100_000), st.sampled_from([681_279, 681_280, 681_281])),
        ),
        st.sampled_from(BAD_LINES),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(
    rows=random_rows,
    first=st.dates(date(2026, 8, 22), date(2026, 9, 5)),
    days=st.integers(0, 14),
    threshold=st.sampled_from([0, 681_280, 700_000]),
)
def test_affected_is_exactly_the_rows_matching_model_window_and_threshold(rows, first, days, threshold):
    """Over random logs, affected equals a brute-force filter computed from the rows' own values."""
    checklist = Checklist(first_day=first, last_day=first + timedelta(days=days), min_prompt_tokens=threshold)
    lines, expected, expected_malformed = [], [], []
    for i, item in enumerate(rows, start=1):
        if isinstance(item, str):
            lines.append(item)
            expected_malformed.append(i)
            continue
        local, zone, model, tokens = item
        lines.append(json.dumps(row(timestamp=local.isoformat() + zone, request_id=f"r{i}", model=model, prompt_tokens=tokens)))
        utc_day = (local - ZONES[zone]).date()
        if model == INCIDENT_MODEL and checklist.first_day <= utc_day <= checklist.last_day and tokens > threshold:
            expected.append(f"r{i}")
    result = scan_records(parse_lines(lines), checklist)
    assert result.affected_ids == expected
    assert [m.line for m in result.malformed] == expected_malformed
    assert result.scanned == len(rows)


# --- memory, the shipped log, and the command line ------------------------------------------


def test_memory_stays_flat_on_a_long_log(tmp_path: Path):
    """Scanning 12,000 lines (3.5 MB) holds well under a tenth of the file in memory at once."""
    path = tmp_path / "long.jsonl"
    line = json.dumps(row(model="@cf/qwen/qwen3-30b-a3b-fp8", response_text="x" * 100)) + "\n"
    path.write_text(line * 12_000)
    tracemalloc.start()
    try:
        result = scan_log(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.scanned == 12_000 and not result.affected
    assert peak < path.stat().st_size / 10, f"peak {peak:,} bytes"


def test_the_shipped_log_is_what_the_script_writes(tmp_path: Path):
    """data/gateway_logs.jsonl.gz is byte for byte `write_gateway_log(path)` with the defaults."""
    write_gateway_log(tmp_path / "fresh.jsonl.gz")
    assert (tmp_path / "fresh.jsonl.gz").read_bytes() == SHIPPED_LOG.read_bytes()


def test_every_leaked_call_in_the_shipped_log_is_in_the_checklist_set():
    """The checklist is a superset: every call the synthetic world leaked is affected."""
    with gzip.open(SHIPPED_LOG) as lines:
        records = [r for r in parse_lines(lines) if isinstance(r, GatewayRecord)]
    truly_leaked = {r.request_id for r in records if leaked(r.timestamp, r.model, r.prompt_tokens) and r.status == 200}
    result = scan_log(SHIPPED_LOG)
    assert truly_leaked and truly_leaked < set(result.affected_ids)
    assert len(records) >= 10_000 and len({r.model for r in records}) >= 4
    assert any(r.model == INCIDENT_MODEL and r.prompt_tokens > 681_280 and not Checklist().matches(r) for r in records)


def test_small_generated_logs_are_clean_and_sized_exactly():
    """Under 1,000 rows the generator writes only well-formed lines, exactly as many as asked."""
    lines = list(generate_rows(300, seed=7))
    assert len(lines) == 300
    assert all(isinstance(item, GatewayRecord) for item in parse_lines(lines))


def cli_args(add, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(argv)


def test_run_scan_logs_exit_status(tmp_path: Path, capsys):
    """0 when nothing is found, 1 when something needs review, 2 when the scan cannot run."""
    (tmp_path / "clean.jsonl").write_text(json.dumps(row(prompt_tokens=10, ttft_ms=200.0)) + "\n")
    (tmp_path / "hit.jsonl").write_text(json.dumps(row()) + "\n")
    assert run_scan_logs(cli_args(add_scan_logs_arguments, str(tmp_path / "clean.jsonl"))) == 0
    assert run_scan_logs(cli_args(add_scan_logs_arguments, str(tmp_path / "hit.jsonl"))) == 1
    assert run_scan_logs(cli_args(add_scan_logs_arguments, str(tmp_path / "hit.jsonl"), "--since", "2026-13-01")) == 2
    assert "--since '2026-13-01' is not a date" in capsys.readouterr().err


def test_text_report_says_when_utc_was_assumed(tmp_path: Path, capsys):
    """The plain report ends with a note when a timestamp had no zone."""
    (tmp_path / "log.jsonl").write_text(json.dumps(row(timestamp="2026-09-01T12:00:00")) + "\n")
    run_scan_logs(cli_args(add_scan_logs_arguments, str(tmp_path / "log.jsonl")))
    assert capsys.readouterr().out.splitlines()[-1] == "note: 1 timestamp had no time zone; read as UTC (first at line 1)"


def test_run_make_logs_writes_the_rows_asked_for(tmp_path: Path, capsys):
    """make-logs OUT --rows N writes N lines."""
    out = tmp_path / "small.jsonl"
    assert run_make_logs(cli_args(add_make_logs_arguments, str(out), "--rows", "50", "--seed", "3")) == 0
    assert len(out.read_text().splitlines()) == 50
    assert run_make_logs(cli_args(add_make_logs_arguments, str(tmp_path / "no" / "dir.jsonl"))) == 2


def minikv(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minikv", *argv], capture_output=True, text=True, timeout=120)


def test_cli_scan_logs_json_on_the_shipped_log():
    """`python -m minikv scan-logs data/... --json` prints the documented shape."""
    done = minikv("scan-logs", str(SHIPPED_LOG), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert list(report) == ["scanned", "malformed", "affected", "flags", "malformed_count", "read_error"]
    assert report["read_error"] is None and report["malformed_count"] == len(report["malformed"]) == 2
    assert report["affected"] == scan_log(SHIPPED_LOG).affected_ids
    assert all(set(f) == {"request_id", "reasons"} for f in report["flags"])
    assert "read as UTC" in done.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["scan-logs", "/no/such/log.jsonl"], "no such file"),
        (["scan-logs", str(SHIPPED_LOG), "--since", "27/08/2026"], "is not a date"),
        (["scan-logs", str(SHIPPED_LOG), "--min-prompt-tokens", "lots"], "is not a whole number"),
        (["scan-logs", str(SHIPPED_LOG), "--pattern", "(["], "not a regular expression"),
        (["scan-logs", str(SHIPPED_LOG), "--since", "2026-09-10"], "after it ends"),
    ],
)
def test_cli_bad_input_is_one_line_not_a_traceback(argv: list[str], message: str):
    """Bad input exits 2 with a single line on stderr that says what is wrong."""
    done = minikv(*argv)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def minikv_with_input(data: bytes, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minikv", *argv], input=data, capture_output=True, timeout=120)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_cli_reads_stdin_from_a_pipe(packed: bool):
    """`... | scan-logs - --json` scans what arrives on stdin, plain or gzip, like a file."""
    data = numbered_log(30)
    done = minikv_with_input(gzip.compress(data) if packed else data, "scan-logs", "-", "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["affected"] == [f"r{i}" for i in range(1, 31)]


def test_cli_reads_a_named_pipe(tmp_path: Path):
    """A FIFO (what `<(zcat log.gz)` gives) cannot seek; it is read all the same."""
    import os
    import threading

    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(gzip.compress(numbered_log(12))))
    writer.start()
    done = minikv("scan-logs", str(fifo), "--json")
    writer.join(timeout=60)
    assert done.returncode == 1, done.stderr
    assert len(json.loads(done.stdout)["affected"]) == 12


def test_cli_truncated_gzip_prints_the_report_then_one_error_line(tmp_path: Path):
    """A log cut short: the rows before the cut are reported, then exit 2 with one error line."""
    packed = gzip.compress(numbered_log(5_000))
    (tmp_path / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    done = minikv("scan-logs", str(tmp_path / "cut.jsonl.gz"), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 2 and len(report["affected"]) > 1_000
    assert report["read_error"] and "breaks off after line" in report["read_error"]
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: ")
