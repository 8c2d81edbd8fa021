"""Over-length: a prompt past the window must be refused, and one at its top read (notebook 05). The check
fits a line to the fastest times of short prompts (1/64 to 3/16 of the window, five times each) and fails a
top prompt answered 200 in under half what the line predicts (docs/serve.md, "The probe")."""

import statistics
from http import HTTPStatus

from minikv.probe.report import FAIL, PASS, CheckResult, Incomplete
from minikv.probe.session import MARGIN_TOKENS, ProbeSession, fastest_ms

MAX_TOKENS = 4
REPEATS = 5
TREND_FRACTIONS = (1 / 64, 1 / 16, 1 / 8, 3 / 16)  # of the window: small enough for any pool
BLIND_RATIO = 0.5  # the top prompt's TTFT under half the trend's prediction: it was not read
READABLE_RATIO = 1.5  # the trend must predict clearly more time at the top than at the start


def check_over_length(s: ProbeSession, result: CheckResult) -> None:
    sent, obs = s.send(s.key_b, s.scale.words_over(s.context + MARGIN_TOKENS), MAX_TOKENS)
    result.note(f"{sent} (the window is {s.context:,} tokens)", obs.summary())
    if obs.status == HTTPStatus.OK:
        result.decide(FAIL, f"a prompt past the {s.context:,}-token window was answered 200")
        return
    top = s.scale.words_for(s.context - MAX_TOKENS - MARGIN_TOKENS)
    sizes = sorted({s.scale.words_for(max(8, int(s.context * f))) for f in TREND_FRACTIONS}) + [top]
    ttft: dict[int, list[float]] = {w: [] for w in sizes}
    statuses: set[int] = set()
    for _ in range(REPEATS):
        for words in sizes:
            sent, obs = s.send(s.key_b, words, MAX_TOKENS)
            result.note(sent, obs.summary())
            if obs.status == HTTPStatus.OK:
                ttft[words].append(obs.first_token_s)
            statuses.add(obs.status)
    trend = [(s.scale.tokens(w), fastest_ms(ttft[w])) for w in sizes[:-1] if ttft[w]]
    if len(trend) < 2:
        raise Incomplete(f"too few short prompts were served (statuses {sorted(statuses)}) to draw the trend")
    if not ttft[top]:
        result.decide(PASS, "past the window refused; the top of the window never answered 200")
        return
    line = statistics.linear_regression([t for t, _ in trend], [ms for _, ms in trend])
    tokens_top, measured = s.scale.tokens(top), fastest_ms(ttft[top])
    predicted = line.intercept + line.slope * tokens_top
    result.note("(fastest time to first token)", "; ".join(f"{t:,} tokens: {ms:.1f} ms" for t, ms in trend)
                + f"; {tokens_top:,} tokens: {measured:.1f} ms (the trend predicts {predicted:.1f} ms)")
    if predicted < READABLE_RATIO * trend[0][1]:
        raise Incomplete("past the window refused; but the short prompts' times do not grow enough to tell a "
                         "read prompt from an unread one here")
    if measured < BLIND_RATIO * predicted:
        result.decide(FAIL, f"a {tokens_top:,}-token prompt was answered 200 in less than half the time prefill "
                            "needs: it was not read (answered 200 over-length)")
    else:
        result.decide(PASS, "past the window refused; the longest prompt it accepts took as long as prefill needs")
