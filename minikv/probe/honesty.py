"""Prompt-token honesty: usage.prompt_tokens is what was sent, and reading more takes longer.

`usage.prompt_tokens` must follow the token scale measured at calibration for prompts of every
size (a server that counts what it *processed* instead of what it was *sent*, or pads or trims
silently, shows here). And time to first token must not fall as the prompt grows: prefill reads
every prompt token, so a longer prompt cannot come back sooner (the tell of notebook 05).
"""

from __future__ import annotations

from http import HTTPStatus

from minikv.probe.report import FAIL, INCOMPLETE, PASS, CheckResult
from minikv.probe.session import ProbeSession, fastest_ms

FRACTIONS = (1 / 16, 1 / 4, 1 / 2)  # of the window: inside any pool sized for a fraction of it
REPEATS = 3
MAX_TOKENS = 1
COUNT_TOLERANCE = 0.02  # of the expected count, and at least 2 tokens
SHRINK_RATIO = 0.8  # the longest prompt's TTFT below this fraction of the shortest's: dishonest


def check_honesty(s: ProbeSession, result: CheckResult) -> None:
    sizes = [s.scale.words_for(int(s.context * f)) for f in FRACTIONS]
    ttft: dict[int, list[float]] = {w: [] for w in sizes}
    wrong = []
    for _ in range(REPEATS):
        for words in sizes:
            sent, obs = s.send(s.key_a, words, MAX_TOKENS)
            result.note(sent, obs.summary())
            if obs.status != HTTPStatus.OK:
                result.decide(INCOMPLETE, f"a {s.scale.tokens(words):,}-token prompt, half the window or less, was not served "
                                          f"({obs.status}): the counts cannot be checked")
                return
            expected = s.scale.tokens(words)
            if obs.prompt_tokens is None or abs(obs.prompt_tokens - expected) > max(2, COUNT_TOLERANCE * expected):
                wrong.append((expected, obs.prompt_tokens))
            ttft[words].append(obs.first_token_s)
    if wrong:
        expected, got = wrong[0]
        result.decide(FAIL, f"usage.prompt_tokens is {got} for a prompt of {expected} tokens ({len(wrong)} such replies)")
        return
    short, long = sizes[0], sizes[-1]
    t_short, t_long = fastest_ms(ttft[short]), fastest_ms(ttft[long])
    rate = (s.scale.tokens(long) - s.scale.tokens(short)) / max(1e-9, (t_long - t_short) / 1e3)
    result.note("(fastest time to first token)", f"{s.scale.tokens(short):,} tokens: {t_short:.1f} ms; "
                                                f"{s.scale.tokens(long):,} tokens: {t_long:.1f} ms")
    if t_long < SHRINK_RATIO * t_short:
        result.decide(FAIL, "the longer prompt came back sooner than the shorter: its tokens were not all read")
    else:
        shown = f"about {rate:,.0f} tokens/s" if t_long > t_short else "too fast to measure here"
        result.decide(PASS, f"prompt_tokens matches what was sent; prefill reads {shown}")
