"""How much `/health`'s round trip, asked without a key, tells about another tenant's activity.

    python scripts/health_oracle.py --trials 20        # starts `minikv serve --preset safe` with two keys

Each trial, in a random order, key A either sends nothing or a 600-character prompt (non-streamed, 64 tokens);
meanwhile an observer with no key times 10 `/health` round trips. The reading is the median of the 10. It
reports the ROC AUC (the chance that a random busy window reads slower than a random idle one; 0.5: no
information) from scipy's Mann-Whitney U, and both medians.
"""

import argparse
import random
import statistics
import threading
import time

import httpx
from scipy.stats import mannwhitneyu

from minikv.serve.launch import ServerProcess

KEY = "sk-oracle-a-0001"
PROMPT = "alice: read " + "the quick brown fox jumps over the lazy dog. " * 13 + "\n"  # about 600 characters
POLLS, POLL_GAP_S = 10, 0.01


def window(server: ServerProcess, busy: bool) -> float:
    """The median /health round trip (ms) while A is busy or idle."""
    sender = threading.Thread(target=lambda: httpx.post(
        server.base_url + "/completions", json={"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 64},
        headers={"Authorization": f"Bearer {KEY}"}, timeout=60))
    if busy:
        sender.start()
        time.sleep(0.005)
    times = []
    with httpx.Client(timeout=10) as observer:
        for _ in range(POLLS):
            start = time.perf_counter()
            observer.get(server.url + "/health")
            times.append(1000 * (time.perf_counter() - start))
            time.sleep(POLL_GAP_S)
    if busy:
        sender.join()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="trials of each kind (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    kinds = [True, False] * args.trials
    random.Random(args.seed).shuffle(kinds)
    with ServerProcess(["--preset", "safe", "--api-key", f"alice={KEY}"]) as server:
        window(server, True)  # warm-up
        readings = {True: [], False: []}
        for busy in kinds:
            readings[busy].append(window(server, busy))
    u = mannwhitneyu(readings[True], readings[False], alternative="two-sided").statistic
    auc = u / (len(readings[True]) * len(readings[False]))
    busy, idle = statistics.median(readings[True]), statistics.median(readings[False])
    print(f"/health round trip, median of {POLLS} polls: A busy {busy:.2f} ms, A idle {idle:.2f} ms; "
          f"ROC AUC {auc:.2f} ({args.trials} trials each)")


if __name__ == "__main__":
    main()
