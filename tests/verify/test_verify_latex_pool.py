"""Time limits that never flip a verdict: the retry on a warm worker, timeouts reported and never cached,
the limit covering the wait for a worker, timeouts counted by the rewards (issue 14).

Real worker processes throughout; a "cold" fork server (``LatexPool(cold=True)``, no warm-up) is how
the first comparison of a new kind of answer is made reliably slower than the first attempt's limit.
"""
from __future__ import annotations

import threading
import time

import pytest

from grpo.verify import equivalence
from grpo.verify.equivalence import Verdict, judge
from grpo.verify.latex_pool import LatexPool
from grpo.verify.rewards import compute_rewards, correctness

POLYNOMIAL = ("(x+1)^2", "x^2+2x+1")  # the first one in a process costs 0.5-2 s; warm, milliseconds


@pytest.fixture
def cold_pool():
    pool = LatexPool(cold=True)
    assert pool.compare("1", "1", False, timeout_s=120.0, retry_after_s=120.0)  # started, off the clock
    yield pool
    pool.stop()


def test_a_slow_first_comparison_of_a_new_kind_is_retried_not_flipped(cold_pool, monkeypatch):
    # The first polynomial in a cold worker takes far longer than the first attempt's 20 ms: the
    # retry on a fresh worker races it, and the verdict is the right one, not a timeout read as "no".
    monkeypatch.setattr(equivalence, "_POOL", cold_pool)
    monkeypatch.setattr(equivalence, "RETRY_AFTER", 0.02 / 60.0)
    equivalence._latex_equal.cache_clear()
    assert judge(POLYNOMIAL[1], POLYNOMIAL[0], "latex", timeout_s=60.0) is Verdict.EQUIVALENT
    assert (cold_pool.retries, cold_pool.timeouts) == (1, 0)
    # The same pair again: the same verdict, from the cache and from a worker.
    assert judge(POLYNOMIAL[1], POLYNOMIAL[0], "latex", timeout_s=60.0) is Verdict.EQUIVALENT
    assert cold_pool.compare(*POLYNOMIAL, False, timeout_s=60.0, retry_after_s=60.0) is True
    equivalence._latex_equal.cache_clear()


def test_a_timeout_is_reported_and_never_cached(caplog):
    pair = ("\\sqrt{50}", "5\\sqrt{2}")
    # 1 ms is less than any worker needs to parse LaTeX: this call cannot finish in time.
    assert judge(pair[1], pair[0], "latex", timeout_s=0.001) is Verdict.TIMEOUT
    assert "verifier timeout" in caplog.text and "5\\\\sqrt{2}" in caplog.text  # logged with the pair
    assert judge(pair[1], pair[0], "latex") is Verdict.EQUIVALENT  # asked again: compared again
    assert judge(pair[1], pair[0], "latex") is Verdict.EQUIVALENT


def test_the_limit_covers_the_wait_for_a_busy_worker():
    pool = LatexPool()
    pool.compare("1", "1", False, timeout_s=120.0, retry_after_s=120.0)  # started, off the clock
    busy = threading.Thread(target=pool.compare, args=("10^{10^{10}}", "3", False),
                            kwargs={"timeout_s": 4.0, "retry_after_s": 4.0})
    busy.start()
    try:
        while pool._worker is not None or not pool._lock.locked():  # the pathological call holds the pool
            time.sleep(0.001)
        assert pool.compare("\\sqrt{4}", "2", False, timeout_s=0.3, retry_after_s=0.1) is None
        assert busy.is_alive()  # the short call gave up while the long one still held the worker
    finally:
        pool.stop()
        busy.join()


def test_a_pathological_pair_is_killed_and_the_next_call_is_served():
    pool = LatexPool()
    try:
        assert pool.compare("10^{10^{10}}", "2", False, timeout_s=0.5, retry_after_s=0.2) is None
        assert (pool.retries, pool.timeouts) == (1, 1)  # both attempts killed at the limit
        assert pool.compare("\\sqrt{9}", "3", False, timeout_s=30.0, retry_after_s=30.0) is True
    finally:
        pool.stop()


def test_rewards_count_timeouts():
    row = {"answer": "2", "answer_type": "integer"}
    result = correctness("\\boxed{10^{10^{10}}}", row)
    assert (result.value, result.timed_out) == (0.0, True)
    assert result.reason.endswith("verifier timeout")
    scored = compute_rewards(["\\boxed{10^{10^{10}}}", "\\boxed{2}", "\\boxed{3}"], [row] * 3,
                             {"correctness": 1.0}, ["stop"] * 3, [5] * 3, 16)
    assert scored.per_fn["correctness"] == [0.0, 1.0, 0.0]
    assert scored.verify_timeouts == 1


def test_a_process_holding_more_than_1024_file_descriptors_still_compares():
    """``select.select`` refuses descriptors past 1024 (FD_SETSIZE); the test session once held that many,
    and every LaTeX comparison then failed with "filedescriptor out of range in select()"."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(hard, 4096) < 1200:
        pytest.skip(f"the open-file limit ({hard}) leaves no room past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = []
    try:
        while not held or held[-1] < 1100:  # the pool's sockets are opened after these, past 1100
            held.append(os.open(os.devnull, os.O_RDONLY))
        pool = LatexPool()
        try:
            assert pool.compare("\\frac{1}{2}", "0.5", False, timeout_s=120.0, retry_after_s=120.0)
            assert pool.compare("\\frac{1}{3}", "0.5", False, timeout_s=120.0, retry_after_s=120.0) is False
        finally:
            pool.stop()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
