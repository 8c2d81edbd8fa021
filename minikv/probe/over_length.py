"""Over-length: what the endpoint cannot hold must be refused, never answered 200.

Two ways to fail. A prompt just past the advertised window answered 200 means the window is
not enforced. A prompt at the top of the window answered 200 *as fast as a short one* was not read: that is the incident's shape (notebook 05), a prompt longer than the prefill
pool swapped for a placeholder and answered from whatever the decode pages held. Reading a
prompt takes time in proportion to its length, so the top-of-window prompt must take clearly
longer than a short one (both timed three times, medians compared).
"""

from __future__ import annotations

from http import HTTPStatus

from minikv.probe.report import FAIL, INCOMPLETE, PASS, CheckResult
from minikv.probe.session import ProbeSession, median_ms

MAX_TOKENS = 4
REPEATS = 3
BLIND_RATIO = 1.5  # a top-of-window prompt's TTFT under 1.5x a short one's: it was not read
SHORT_TOKENS = 16
MARGIN_TOKENS = 16  # room for the tokenizer scale's rounding


def check_over_length(s: ProbeSession, result: CheckResult) -> None:
    beyond = s.scale.words_over(s.context + MARGIN_TOKENS)
    sent, obs = s.send(s.key_b, beyond, MAX_TOKENS)
    result.note(f"{sent} (the window is {s.context:,} tokens)", obs.summary())
    if obs.status == HTTPStatus.OK:
        result.decide(FAIL, f"a prompt past the {s.context:,}-token window was answered 200")
        return
    top = s.scale.words_for(s.context - MAX_TOKENS - MARGIN_TOKENS)
    short = s.scale.words_for(max(SHORT_TOKENS, s.context // 64))
    ttft: dict[int, list[float]] = {top: [], short: []}
    not_served = []
    for _ in range(REPEATS):
        for words in (short, top):
            sent, obs = s.send(s.key_b, words, MAX_TOKENS)
            result.note(sent, obs.summary())
            if obs.status == HTTPStatus.OK:
                ttft[words].append(obs.first_token_s)
            else:
                not_served.append(obs.status)
    if not ttft[short]:
        result.decide(INCOMPLETE, f"no short prompt was served (status {not_served[0]}): nothing to compare with")
        return
    if not ttft[top]:
        result.decide(PASS, f"past the window refused; the top of the window never answered 200 (status {not_served[-1]})")
        return
    t_top, t_short = median_ms(ttft[top]), median_ms(ttft[short])
    result.note("(median time to first token)", f"{s.scale.tokens(top):,} tokens: {t_top:.1f} ms; "
                                                f"{s.scale.tokens(short):,} tokens: {t_short:.1f} ms")
    if t_top < BLIND_RATIO * t_short:
        result.decide(FAIL, f"a {s.scale.tokens(top):,}-token prompt was answered 200 no slower than a "
                            f"{s.scale.tokens(short):,}-token one: it was not read (answered 200 over-length)")
    else:
        result.decide(PASS, "past the window refused; the longest prompt it accepts took longer to read than a short one")
