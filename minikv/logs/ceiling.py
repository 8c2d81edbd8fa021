"""The prefill-rate ceiling a log teaches about itself (docs/logs.md, "The ceiling learned from the log").

Rows are grouped by model and prompt size ([2**k, 2**(k+1)) tokens); a row is an outlier when its rate lies
more than K_SPREADS robust spreads above its group's median, or, in a group too small to learn from, when it
comes back in under BLIND_RATIO of the time its model's trend (`scipy.stats.theilslopes`) predicts."""

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field, replace

from scipy.stats import theilslopes

from minikv.logs.gateway_log import GatewayRecord

K_SPREADS = 12.0
MIN_SPREAD_DECADES = 0.05  # 12%: rows of one size that all read alike do not make a hair trigger
MIN_ROWS = 5
FAST_QUANTILE = 0.9  # of a group's rates: its fast end, which load does not reach
BLIND_RATIO = 0.5  # as the probe's over-length check: under half the trend's time was not read
BIN_DECADES = 0.005  # histogram resolution, about 1% of a rate
MAX_CANDIDATES = 200  # fastest rows kept per group; more above the ceiling are counted, not listed
INFINITE_BIN = 10**9  # a first token at 0 ms: faster than any bin


Group = tuple[str, int]  # (model, k): prompts of [2**k, 2**(k+1)) tokens to one model


def size_group(record: GatewayRecord) -> Group:
    assert record.prompt_tokens > 0
    return record.model, record.prompt_tokens.bit_length() - 1


def group_label(group: Group) -> str:
    model, k = group
    return f"{model} {2 ** k:,}-{2 ** (k + 1) - 1:,} tokens"


def _bin(rate: float) -> int:
    return INFINITE_BIN if math.isinf(rate) else round(math.log10(rate) / BIN_DECADES)


def _weighted_quantile(counts: Counter[int], q: float = 0.5) -> int:
    """The q-quantile (default: the median) of values given as {value: how many}."""
    total, seen = sum(counts.values()), 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= q * total:
            return value
    raise AssertionError("no values")


@dataclass
class RateGroup:
    """One prompt-size group: a histogram of log10 rates (in bins) and the fastest rows."""

    bins: Counter[int] = field(default_factory=Counter)
    fastest: list[tuple[float, int, GatewayRecord]] = field(default_factory=list)  # a min-heap by rate
    tokens: int = 0  # summed prompt_tokens of its rows

    def add(self, record: GatewayRecord, rate: float) -> None:
        self.bins[_bin(rate)] += 1
        self.tokens += record.prompt_tokens
        item = (rate, record.line, replace(record, response_text=""))  # the text is not needed to list a row
        if len(self.fastest) < MAX_CANDIDATES:
            heapq.heappush(self.fastest, item)
        elif rate > self.fastest[0][0]:
            heapq.heapreplace(self.fastest, item)

    def finite(self) -> Counter[int]:
        return Counter({b: n for b, n in self.bins.items() if b != INFINITE_BIN})

    def fast_ttft_s(self) -> float:
        """The group's fast time to first token: its mean size over its FAST_QUANTILE rate."""
        fast_bin = _weighted_quantile(self.finite(), FAST_QUANTILE)
        return self.tokens / sum(self.bins.values()) / 10 ** (fast_bin * BIN_DECADES)

    def ceiling(self) -> float | None:
        """Tokens per second above which a row is an outlier; None for a group too small to teach."""
        finite = self.finite()
        if sum(finite.values()) < MIN_ROWS:
            return None
        median = _weighted_quantile(finite)
        deviations: Counter[int] = Counter()
        for b, n in finite.items():
            deviations[abs(b - median)] += n
        spread = max(1.4826 * _weighted_quantile(deviations) * BIN_DECADES, MIN_SPREAD_DECADES)
        return 10 ** (median * BIN_DECADES + K_SPREADS * spread)


@dataclass
class LearnedCeiling:
    """Every answered row's rate, by size group; then the rows above their group's ceiling."""

    fallback: float  # tokens/s for the rows of groups too small to teach
    groups: dict[Group, RateGroup] = field(default_factory=dict)

    def add(self, record: GatewayRecord, rate: float) -> None:
        if record.prompt_tokens > 0:
            self.groups.setdefault(size_group(record), RateGroup()).add(record, rate)

    def ceilings(self) -> dict[Group, float | None]:
        return {g: self.groups[g].ceiling() for g in sorted(self.groups)}

    def trend(self, model: str) -> tuple[float, float, float] | None:
        """(intercept s, slope s/token, smallest learned mean size) of a model's learned groups' fast TTFT;
        None without two learned groups of different sizes."""
        learned = [g for g, c in self.ceilings().items() if c is not None and g[0] == model]
        sizes = [self.groups[g].tokens / sum(self.groups[g].bins.values()) for g in learned]
        if len(set(sizes)) < 2:
            return None
        fit = theilslopes([self.groups[g].fast_ttft_s() for g in learned], sizes)
        return fit.intercept, fit.slope, min(sizes)

    def outliers(self) -> tuple[list[GatewayRecord], int]:
        """(the rows above their group's ceiling or under the trend, in file order; how many more were
        above it but not kept)."""
        rows, unlisted = [], 0
        for group, ceiling in self.ceilings().items():
            kept = self.groups[group].fastest
            if ceiling is None:
                trend = self.trend(group[0])
                rows += [record for rate, _, record in kept if _unread(record, rate, trend, self.fallback)]
                continue
            rows += [record for rate, _, record in kept if rate > ceiling]
            if len(kept) == MAX_CANDIDATES and kept[0][0] > ceiling:  # every kept row is above: some were not kept
                above = sum(n for b, n in self.groups[group].bins.items() if 10 ** (b * BIN_DECADES) > ceiling)
                unlisted += max(0, above - len(kept))
        return sorted(rows, key=lambda r: r.line), unlisted


def _unread(record: GatewayRecord, rate: float, trend: tuple[float, float, float] | None, fallback: float) -> bool:
    """A row of a group too small to learn from: faster than the trend allows, or the fixed ceiling."""
    if trend is None:
        return rate > fallback
    intercept, slope, smallest = trend
    predicted_s = intercept + slope * record.prompt_tokens
    return record.prompt_tokens > smallest and predicted_s > 0 and record.ttft_ms / 1e3 < BLIND_RATIO * predicted_s
