"""Exact 95 % intervals for the figures a test set gives: a false reject rate (k misses of n positives,
Clopper-Pearson) and a false alarm rate (k false alarms in h filler hours, Garwood's exact Poisson).

Both invert the exact tail probabilities by bisection, in log space, so they need nothing beyond the
standard library and hold for any count (a zero count has lower bound 0). `ZERO_EVENTS_UPPER` is the
one-sided 95 % upper bound of a Poisson count of zero (-ln 0.05 = 3.0 events): zero false alarms in h
hours show the rate is below 3.0 / h FA/h, so a target below that is not resolved by the test set.
"""

import math

LEVEL = 0.95
ZERO_EVENTS_UPPER = -math.log(1 - LEVEL)  # 2.996 events
_ITERATIONS = 100


def _log_add(a, b):
    if a == -math.inf:
        return b
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


def _binomial_cdf(k, n, p):
    """P(X <= k) for X ~ Binomial(n, p)."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = -math.inf
    for i in range(k + 1):
        term = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
        total = _log_add(total, term)
    return min(1.0, math.exp(total))


def _poisson_cdf(k, mean):
    """P(X <= k) for X ~ Poisson(mean)."""
    if mean <= 0:
        return 1.0
    total = -math.inf
    for i in range(k + 1):
        total = _log_add(total, -mean + i * math.log(mean) - math.lgamma(i + 1))
    return min(1.0, math.exp(total))


def _solve(decreasing, target, low, high):
    """x in [low, high] where the decreasing function crosses target."""
    for _ in range(_ITERATIONS):
        mid = (low + high) / 2
        if decreasing(mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def binomial_interval(k, n, level=LEVEL):
    """Clopper-Pearson interval (low, high) of a proportion k / n."""
    if not (0 <= k <= n) or n <= 0:
        raise ValueError(f"binomial interval of {k} / {n}")
    tail = (1 - level) / 2
    # P(X >= k; p) = 1 - cdf(k - 1; p) grows with p; P(X <= k; p) falls with p
    low = 0.0 if k == 0 else _solve(lambda p: _binomial_cdf(k - 1, n, p), 1 - tail, 0.0, 1.0)
    high = 1.0 if k == n else _solve(lambda p: _binomial_cdf(k, n, p), tail, 0.0, 1.0)
    return low, high


def poisson_interval(k, level=LEVEL):
    """Garwood's exact interval (low, high) of a Poisson mean from a count k."""
    if k < 0:
        raise ValueError(f"poisson interval of {k}")
    tail = (1 - level) / 2
    top = k + 20 * math.sqrt(k + 1) + 20
    low = 0.0 if k == 0 else _solve(lambda m: _poisson_cdf(k - 1, m), 1 - tail, 0.0, top)
    high = _solve(lambda m: _poisson_cdf(k, m), tail, 0.0, top)
    return low, high


def rate_interval(k, hours, level=LEVEL):
    """The 95 % interval of an hourly rate from k events in `hours`."""
    low, high = poisson_interval(k, level)
    return low / hours, high / hours
