"""`minikv probe` against what other servers do that the API allows: streams without `data: [DONE]`, usage
without `cached_tokens`, `/v1/models` cards without a window; and the summary a learner reads.

Fake endpoints (tests/fake_endpoint.py) through the real command line, in this process.
"""

from __future__ import annotations

import json

import pytest
from fake_endpoint import FakeEndpoint, events, honest_usage
from test_probe_malformed import KEYS, run_cli

from minikv.probe.report import FAIL, INCOMPLETE, INFO, PASS, CheckResult, ProbeReport


def final_chunk_without_done(h, body) -> None:
    """As `transformers serve` streams: text, then one chunk with finish_reason and usage, then the stream ends."""
    usage = {k: v for k, v in honest_usage(body).items() if k != "prompt_tokens_details"}
    events(h, {"choices": [{"index": 0, "text": "x"}]},
           {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}, done=False)


def finish_without_usage(h, body) -> None:
    """A finish_reason, then the stream ends before the usage chunk the probe asked for."""
    events(h, {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}, done=False)


def more_cached_than_sent(h, body) -> None:
    usage = honest_usage(body)
    usage["prompt_tokens_details"] = {"cached_tokens": usage["prompt_tokens"] + 1}
    events(h, {"choices": [{"text": "x"}]}, {"choices": [], "usage": usage})


def probe_fake(capsys, *extra: str, **routes) -> tuple[int | None, str, str]:
    with FakeEndpoint(**routes) as fake:
        status, out, err, _ = run_cli([fake.url, *KEYS, "--seed", "0", "--rounds", "5", *extra], capsys)
    return status, out, err


def test_a_stream_that_ends_after_its_final_chunk_is_whole(capsys):
    """No [DONE] after a final chunk (finish_reason and usage): the probe runs to its verdicts and names both quirks,
    one line each, as well as the model id it took from /v1/models."""
    status, out, err = probe_fake(capsys, "--json", completions=final_chunk_without_done)
    report = json.loads(out)
    assert status in (0, 1) and all(c["verdict"] in (PASS, FAIL) for c in report["checks"]), err
    quirks = report["quirks"]
    assert any("[DONE]" in q for q in quirks) and any("cached_tokens" in q for q in quirks), quirks
    assert any("'fake'" in q and "/v1/models" in q for q in quirks), quirks
    status, out, _ = probe_fake(capsys, completions=final_chunk_without_done)
    quirk_lines = [line for line in out.splitlines() if line.startswith("peer quirk: ")]
    assert len(quirk_lines) == 3, out


def test_an_honest_stream_with_done_and_model_given_has_no_quirks(capsys):
    status, out, err = probe_fake(capsys, "--json", "--model", "fake")
    assert json.loads(out)["quirks"] == [], err


@pytest.mark.parametrize("route", [finish_without_usage,
                                   lambda h, b: events(h, {"choices": [{"text": "x"}]}, done=False)])
def test_a_stream_cut_before_its_final_chunk_is_still_cut_short(route, capsys):
    status, out, err = probe_fake(capsys, "--json", completions=route)
    assert status == 2 and err.startswith("error: ") and "cut short" in err and out == "", err


def test_more_cached_than_sent_could_not_be_probed(capsys):
    """cached_tokens > prompt_tokens is impossible: exit 2 naming the inconsistency, never a FAIL."""
    status, out, err = probe_fake(capsys, "--json", completions=more_cached_than_sent)
    assert status == 2 and "inconsistent" in err and out == "", err


def test_summary_names_the_checks_not_run_and_their_flags():
    report = ProbeReport("http://x/v1", "m", 64, [], results=[CheckResult("canary", PASS)],
                         not_run=["eviction", "token-gaps"])
    assert ("not run: shared eviction order (--check eviction), inter-token gap (--check token-gaps)"
            in report.summary())


def test_blurred_timing_reads_as_could_not_tell_not_as_a_failure():
    """An INCOMPLETE check: 'could not tell' in the summary and the verdict line, no word of failing; exit 2."""
    blurred = CheckResult("over-length", INCOMPLETE, "the short prompts' times do not grow enough to tell")
    report = ProbeReport("http://x/v1", "m", 64, [], results=[CheckResult("canary", PASS), blurred])
    assert report.status == 2
    assert "could not tell: over-length" in report.summary() and "not passed" not in report.summary()
    assert "verdict: COULD NOT TELL" in blurred.format() and "FAIL" not in blurred.format()
    failed = ProbeReport("http://x/v1", "m", 64, [], results=[CheckResult("canary", FAIL), blurred,
                                                               CheckResult("token gaps", INFO)])
    assert "failed: canary; could not tell: over-length" in failed.summary()


def test_the_probe_itself_lists_what_it_did_not_run(capsys):
    status, out, _ = probe_fake(capsys, "--check", "honesty")
    assert status in (0, 1)  # honesty's timing on a loaded machine may go either way; the lines below may not
    assert "not run: canary (--check canary), over-length (--check over-length)" in out, out
