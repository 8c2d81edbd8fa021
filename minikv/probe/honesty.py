"""Prompt-token honesty: usage.prompt_tokens follows the token scale measured at calibration for prompts of
every size (a server that counts what it processed shows here), and a longer prompt, whose prefill reads every
token, cannot come back sooner (the tell of notebook 05)."""

from minikv.probe.report import FAIL, PASS, CheckResult
from minikv.probe.session import ProbeSession, fastest_ms, served

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
            expected, counted = s.scale.tokens(words), served(obs).prompt_tokens
            if counted is None or abs(counted - expected) > max(2, COUNT_TOLERANCE * expected):
                wrong.append((expected, counted))
            ttft[words].append(obs.first_token_s)
    if wrong:
        expected, counted = wrong[0]
        result.decide(FAIL, f"usage.prompt_tokens is {counted} for a prompt of {expected} tokens "
                            f"({len(wrong)} such replies)")
        return
    short, long = s.scale.tokens(sizes[0]), s.scale.tokens(sizes[-1])
    t_short, t_long = fastest_ms(ttft[sizes[0]]), fastest_ms(ttft[sizes[-1]])
    result.note("(fastest time to first token)", f"{short:,} tokens: {t_short:.1f} ms; {long:,} tokens: "
                                                f"{t_long:.1f} ms")
    if t_long < SHRINK_RATIO * t_short:
        result.decide(FAIL, "the longer prompt came back sooner than the shorter: its tokens were not all read")
    else:
        rate = (long - short) / max(1e-9, (t_long - t_short) / 1e3)
        shown = f"about {rate:,.0f} tokens/s" if t_long > t_short else "too fast to measure here"
        result.decide(PASS, f"prompt_tokens matches what was sent; prefill reads {shown}")
