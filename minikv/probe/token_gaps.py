"""Inter-token gap: does key B's own stream show whether key A's prompt hit A's cache? Reported as ROC AUC, an
INFO verdict that never changes the exit status (docs/serve.md, "The inter-token gap")."""

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

from scipy.stats import mannwhitneyu

from minikv.probe.replies import Observation, StreamControl
from minikv.probe.report import INFO, CheckResult, Incomplete
from minikv.probe.session import MARGIN_TOKENS, ProbeSession, median_ms

MAX_TOKENS = 1
MAX_PROMPT_TOKENS = 682  # A's prompts: a third of the window up to this, so that a tenant's own cache share keeps them
B_PROMPT = "1 2 3 4 5 6 7 8 9 10 11 12"  # models go on counting: a long stream
B_MAX_TOKENS = 512
TRIALS = 6  # each: one miss and one hit of A's, beside one stream of B's
MIN_SAMPLES = 3  # of each kind, for an AUC worth printing
PAUSE_S = 0.05  # before each of A's requests and after the last: B's tokens mark where each window ends
FIRST_TOKEN_WAIT_S = 30.0


def check_token_gaps(s: ProbeSession, result: CheckResult) -> None:
    words = s.scale.words_for(min((s.context - MAX_TOKENS - MARGIN_TOKENS) // 3, MAX_PROMPT_TOKENS))
    tokens = s.scale.tokens(words)
    repeated = s.words(words)
    s.client.complete(s.key_a, repeated, MAX_TOKENS)  # A's hit in every trial is this one
    gaps: dict[str, list[float]] = {"miss": [], "hit": []}  # B's largest gap across each of A's requests
    delays: dict[str, list[float]] = {"miss": [], "hit": []}  # B's summed extra delay across it
    hit_cached: list[int] = []
    for _ in range(TRIALS):
        order = [("miss", s.words(words)), ("hit", repeated)]
        s.rng.shuffle(order)
        for (kind, _), (gap, delay, obs) in zip(order, beside_a_stream(s, [p for _, p in order]), strict=True):
            if gap is None or delay is None or obs.status != HTTPStatus.OK:
                continue
            if obs.cached_tokens is not None:  # what A's request was, as the endpoint reports it: a repeat A's own
                kind = "hit" if obs.cached_tokens * 2 >= tokens else "miss"  # cache may have evicted misses
                if kind == "hit":
                    hit_cached.append(obs.cached_tokens)
            gaps[kind].append(gap)
            delays[kind].append(delay)
    result.note(f"{TRIALS} trials: key B streams up to {B_MAX_TOKENS} tokens; meanwhile key A sends a {tokens:,}-token "
                "prompt it sent before (hit) and a fresh one (miss), in a random order",
                f"key B's largest inter-token gap: hit {median_ms(gaps['hit'])}, miss {median_ms(gaps['miss'])}; "
                f"its summed extra delay: hit {median_ms(delays['hit'])}, miss {median_ms(delays['miss'])}"
                + (f"; key A's hits read cached_tokens {min(hit_cached)}-{max(hit_cached)}" if hit_cached else ""))
    if min(len(gaps["miss"]), len(gaps["hit"])) < MIN_SAMPLES:
        raise Incomplete(f"key B's stream covered too few of key A's requests ({len(gaps['miss'])} misses, "
                         f"{len(gaps['hit'])} hits; {MIN_SAMPLES} of each needed)")
    aucs = {"largest gap": roc_auc(gaps["miss"], gaps["hit"]),
            "summed extra delay": roc_auc(delays["miss"], delays["hit"])}
    best = max(aucs, key=aucs.get)
    result.figures.update(auc=aucs[best], auc_largest_gap=aucs["largest gap"],
                          auc_summed_delay=aucs["summed extra delay"], trials=TRIALS, a_prompt_tokens=tokens,
                          gap_ms={k: [round(1e3 * g, 2) for g in v] for k, v in gaps.items()},
                          delay_ms={k: [round(1e3 * d, 2) for d in v] for k, v in delays.items()})
    result.decide(INFO, f"key B tells key A's cache hit from a miss with ROC AUC {aucs[best]:.2f} by its own {best} "
                        f"(largest gap {aucs['largest gap']:.2f}, summed extra delay {aucs['summed extra delay']:.2f}; "
                        f"{len(gaps['miss'])} misses, {len(gaps['hit'])} hits; the chance that a random miss shows "
                        "more than a random hit, 0.5 = no information): a residual of batching, reported and never "
                        "a FAIL")


def beside_a_stream(s: ProbeSession, prompts: list[str]) -> list[tuple[float | None, float | None, Observation]]:
    """Key A sends `prompts` one by one while key B streams: for each, (B's largest gap across it, B's summed
    extra delay across it, A's Observation); both None when B's stream did not span all of A's request."""
    control = StreamControl()
    with ThreadPoolExecutor(max_workers=1) as pool:
        stream = pool.submit(s.client.complete, s.key_b, B_PROMPT, B_MAX_TOKENS, control)
        give_up = min(time.monotonic() + FIRST_TOKEN_WAIT_S, s.client.deadline)
        while not (control.first_text.wait(0.01) or stream.done() or time.monotonic() > give_up):
            pass
        windows = []
        try:
            for prompt in prompts:
                time.sleep(PAUSE_S)
                start = time.perf_counter()
                obs = s.client.complete(s.key_a, prompt, MAX_TOKENS)
                windows.append((start, time.perf_counter(), obs))
            time.sleep(PAUSE_S)
        finally:
            control.stop.set()
        b = stream.result()
    return [(largest_gap(b.text_times, start, end), extra_delay(b.text_times, start, end), obs)
            for start, end, obs in windows]


def largest_gap(times: tuple[float, ...], start: float, end: float) -> float | None:
    """The largest gap between tokens overlapping [start, end]; None unless tokens came on both sides."""
    if not times or times[0] > start or times[-1] < end:
        return None
    return max(t2 - t1 for t1, t2 in zip(times, times[1:]) if t2 > start and t1 < end)


def extra_delay(times: tuple[float, ...], start: float, end: float) -> float | None:
    """The summed excess over B's median gap of the gaps overlapping [start, end]; None unless tokens came
    on both sides. A prefill split into chunks lengthens several gaps a little: their sum shows its cost."""
    if not times or times[0] > start or times[-1] < end:
        return None
    pairs = list(zip(times, times[1:]))
    typical = statistics.median(t2 - t1 for t1, t2 in pairs)
    return sum(max(0.0, t2 - t1 - typical) for t1, t2 in pairs if t2 > start and t1 < end)


def roc_auc(misses: list[float], hits: list[float]) -> float:
    """The chance a random miss's value exceeds a random hit's (ties count half): Mann-Whitney U / (n1 n2)."""
    return float(mannwhitneyu(misses, hits).statistic) / (len(misses) * len(hits))
