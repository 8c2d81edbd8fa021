"""Inter-token gap: does key B's own stream show whether key A's prompt hit A's cache? (a residual)
B streams while A sends a fresh prompt and a repeated one; how well B's largest gap tells them apart is reported
as ROC AUC, an INFO verdict that never changes the exit status (docs/serve.md, "The inter-token gap")."""

import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

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
    gaps: dict[str, list[float]] = {"miss": [], "hit": []}
    hit_cached: list[int] = []
    for _ in range(TRIALS):
        order = [("miss", s.words(words)), ("hit", repeated)]
        s.rng.shuffle(order)
        for (kind, _), (gap, obs) in zip(order, beside_a_stream(s, [p for _, p in order]), strict=True):
            if gap is None or obs.status != HTTPStatus.OK:
                continue
            if obs.cached_tokens is not None:  # what A's request was, as the endpoint reports it: a repeat A's own
                kind = "hit" if obs.cached_tokens * 2 >= tokens else "miss"  # cache may have evicted misses
                if kind == "hit":
                    hit_cached.append(obs.cached_tokens)
            gaps[kind].append(gap)
    result.note(f"{TRIALS} trials: key B streams up to {B_MAX_TOKENS} tokens; meanwhile key A sends a {tokens:,}-token "
                "prompt it sent before (hit) and a fresh one (miss), in a random order",
                f"key B's largest inter-token gap: hit {median_ms(gaps['hit'])}, miss {median_ms(gaps['miss'])}"
                + (f"; key A's hits read cached_tokens {min(hit_cached)}-{max(hit_cached)}" if hit_cached else ""))
    if min(len(gaps["miss"]), len(gaps["hit"])) < MIN_SAMPLES:
        raise Incomplete(f"key B's stream covered too few of key A's requests ({len(gaps['miss'])} misses, "
                         f"{len(gaps['hit'])} hits; {MIN_SAMPLES} of each needed)")
    auc = roc_auc(gaps["miss"], gaps["hit"])
    result.figures.update(auc=auc, trials=TRIALS, a_prompt_tokens=tokens,
                          gap_ms={k: [round(1e3 * g, 2) for g in v] for k, v in gaps.items()})
    result.decide(INFO, f"key B tells key A's cache hit from a miss by its own largest inter-token gap with ROC "
                        f"AUC {auc:.2f} ({len(gaps['miss'])} misses, {len(gaps['hit'])} hits; the chance that a random "
                        "miss shows a larger gap than a random hit, 0.5 = no information): a residual of batching, "
                        "reported and never a FAIL")


def beside_a_stream(s: ProbeSession, prompts: list[str]) -> list[tuple[float | None, Observation]]:
    """Key A sends `prompts` one by one while key B streams: for each, (B's largest gap across it, A's Observation);
    the gap is None when B's stream did not run through the whole of A's request."""
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
    return [(largest_gap(b.text_times, start, end), obs) for start, end, obs in windows]


def largest_gap(times: tuple[float, ...], start: float, end: float) -> float | None:
    """The largest gap between consecutive tokens that overlaps [start, end]; None unless tokens came on both sides."""
    if not times or times[0] > start or times[-1] < end:
        return None
    return max(t2 - t1 for t1, t2 in zip(times, times[1:]) if t2 > start and t1 < end)


def roc_auc(misses: list[float], hits: list[float]) -> float:
    """The chance that a random miss's gap exceeds a random hit's (ties count half): the Mann-Whitney U, scaled."""
    wins = sum((m > h) + 0.5 * (m == h) for m in misses for h in hits)
    return wins / (len(misses) * len(hits))
