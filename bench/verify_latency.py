"""Verifier latency per call (median, p95, max, the worst cases) on the external grader suite and on
1 MB completions, in a cold process and a warm one, on a quiet machine and a loaded one.

A call is what the reward step and the evaluation do per completion: ``extract_answer`` then ``judge``
(suite cases: the prediction's extraction and the equivalence check, the gold answer extracted
beforehand, as tests/verify/test_verify_suite.py calls them), or the ``correctness`` reward on a 1 MB
completion, or a pathological answer that only the time limit stops. Each configuration runs in a
fresh Python process: its first call starts the fork server (reported apart, as start-up: it happens
once per process, before any call's clock starts), pass 1 is then every pair's first comparison in
that process ("cold"), pass 2 repeats it with the verdict cache cleared ("warm"). ``--load N`` runs N
busy processes beside each configuration (2 saturate this 2-core machine). ``--cold-server`` adds the
configurations without the fork server's warm-up, which is how workers started before issue 14.

Run from the project root:
    .venv/bin/python bench/verify_latency.py [--load 2] [--cold-server]
Writes bench/results/verify_latency.json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.data.answers import parse_math  # noqa: E402
from grpo.verify import equivalence  # noqa: E402
from grpo.verify.extract import extract_answer  # noqa: E402
from grpo.verify.latex_pool import LatexPool  # noqa: E402
from grpo.verify.rewards import correctness  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "verify_latency.json"
CASES = ROOT / "tests" / "verify" / "suite" / "cases.jsonl"
MB = 1_000_000
MEGABYTE_COMPLETIONS = {
    "prose then box": "We add the numbers again. " * (MB // 26) + "So the answer is \\boxed{42}.",
    "prose, no answer form": "Step: we add 3 and 4 to get 7.\n" * (MB // 30),
    "open braces": "\\boxed{" + "{" * MB,
    "dollars": "$" * MB,
    "currency prose": "$5 and she has " * (MB // 15),
    "many joined boxes": "\\boxed{1}, " * (MB // 11),
    "box of fractions": "\\boxed{" + "\\frac{1}{2}+" * (MB // 12) + "1}",
    "megabyte number": "<answer>" + "1" * MB + "</answer>",
}
# One pair of each kind the fork server warms up on (other expressions than its own warm-up pairs),
# each compared first in a fresh worker: what issue 14 saw take 1.1-2.1 s on a loaded machine.
FIRST_OF_A_KIND = {
    "polynomial": ("(y-2)^2", "y^2-4y+4"),
    "relation": ("y \\leq 3", "3 \\geq y"),
    "matrix": ("\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}", "2\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}"),
    "union of intervals": ("(-\\infty, 0) \\cup (1, 2]", "(1,2]\\cup(-\\infty,0)"),
    "set": ("\\{3, 4\\}", "\\{4, 3\\}"),
    "root": ("\\frac{\\sqrt{3}}{3}", "1/\\sqrt{3}"),
    "trigonometry": ("\\cot^2(t)+1", "\\csc^2(t)"),
    "equation": ("3x - y = 2", "y = 3x - 2"),
    "logarithm": ("\\log_3 27", "3"),
}
_EXTRACTS_GOLD = ("compare_strings", "verify")  # math-verify's entry points read both strings
PATHOLOGICAL = {  # only a kill stops these
    "power tower": "\\boxed{10^{10^{10}}}",
    "huge power": "\\boxed{2^{2^{40}}}",
    "nested fractions": "\\boxed{" + "\\frac{1}{" * 500 + "2" + "}" * 500 + "}",
}


def _suite_calls() -> list[tuple[str, str, str, str]]:
    """(id, prediction text, gold answer, answer type) for every suite case with a gold answer."""
    calls = []
    for line in CASES.read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        gold_text = extract_answer(case["gold"]) if case["params"]["_call"] in _EXTRACTS_GOLD else case["gold"]
        if gold_text:
            gold = parse_math(gold_text)
            calls.append((f"suite-{case['id']}", case["pred"], gold.answer, gold.answer_type))
    return calls


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def child(cold_server: bool) -> dict:
    """One configuration, in this fresh process."""
    if cold_server:
        equivalence._POOL = LatexPool(cold=True)  # the benchmark's only reach inside: workers without warm-up
    startup_s, _ = _timed(lambda: equivalence.judge("\\sqrt{4}", "2", "latex"))
    kinds = {}
    pool = equivalence._POOL
    for kind, (gold, pred) in FIRST_OF_A_KIND.items():
        pool._worker.kill()  # reaching inside: the next call forks a fresh worker from the server
        pool._worker = None
        pool.compare("1", "1", False, timeout_s=120.0, retry_after_s=120.0)  # its first, trivial comparison
        seconds, verdict = _timed(lambda: equivalence.judge(pred, gold, "latex"))
        kinds[kind] = {"s": seconds, "verdict": verdict.value}
    suite = _suite_calls()
    rows = []
    for pass_name in ("cold", "warm"):
        equivalence._latex_equal.cache_clear()
        for name, pred, gold, answer_type in suite:
            seconds, verdict = _timed(lambda: equivalence.judge(extract_answer(pred), gold, answer_type))
            rows.append({"pass": pass_name, "kind": "suite", "name": name, "s": seconds, "verdict": verdict.value})
        row = {"answer": "42", "answer_type": "integer"}
        for kind, completions in (("1 MB completion", MEGABYTE_COMPLETIONS), ("pathological", PATHOLOGICAL)):
            for name, completion in completions.items():
                seconds, result = _timed(lambda: correctness(completion, row))
                rows.append({"pass": pass_name, "kind": kind, "name": name, "s": seconds,
                             "verdict": "timeout" if result.timed_out else str(result.value)})
    return {"startup_s": startup_s, "retries": pool.retries, "timeouts": pool.timeouts, "kinds": kinds,
            "rows": rows}


def _burn() -> None:
    while True:
        pass


def run_config(cold_server: bool, load: int) -> dict:
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(load)]
    for burner in burners:
        burner.start()
    try:
        args = [sys.executable, __file__, "--child"] + (["--cold-server"] if cold_server else [])
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    finally:
        for burner in burners:
            burner.kill()
            burner.join()
    result = json.loads(out)
    result.update(cold_server=cold_server, load=load)
    return result


def summarize(result: dict, limit: float) -> list[dict]:
    table = []
    for pass_name in ("cold", "warm"):
        for kind in ("suite", "1 MB completion", "pathological"):
            rows = [r for r in result["rows"] if r["pass"] == pass_name and r["kind"] == kind]
            times = sorted(r["s"] for r in rows)
            worst = sorted(rows, key=lambda r: -r["s"])[:3]
            table.append({
                "server": "cold (no warm-up)" if result["cold_server"] else "warm-up", "load": result["load"],
                "pass": pass_name, "kind": kind, "calls": len(rows), "median_s": statistics.median(times),
                "p95_s": times[int(0.95 * (len(times) - 1))], "max_s": times[-1],
                "timeouts": sum(r["verdict"] == "timeout" for r in rows),
                "over_limit_plus_0.2s": sum(t > limit + 0.2 for t in times),
                "worst": [f"{r['name']} {r['s']:.3f}s" for r in worst],
            })
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the loaded configurations")
    parser.add_argument("--cold-server", action="store_true", help="also run without the fork server's warm-up")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.cold_server)))
        return
    limit = equivalence.DEFAULT_TIMEOUT_S
    results = [run_config(cold, load) for cold in ([False, True] if args.cold_server else [False])
               for load in (0, args.load)]
    table = [row for result in results for row in summarize(result, limit)]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": f"{platform.machine()} {multiprocessing.cpu_count()} cores, Python {platform.python_version()}",
        "limit_s": limit, "retry_after_s": limit * equivalence.RETRY_AFTER,
        "startup_s": {f"{'cold' if r['cold_server'] else 'warm-up'}/load {r['load']}": r["startup_s"] for r in results},
        "pool": {f"{'cold' if r['cold_server'] else 'warm-up'}/load {r['load']}": {"retries": r["retries"],
                                                                                  "timeouts": r["timeouts"]}
                 for r in results},
        "first_of_a_kind_s": {f"{'cold' if r['cold_server'] else 'warm-up'}/load {r['load']}": r["kinds"]
                              for r in results},
        "table": table,
    }, indent=2) + "\n", encoding="utf-8")
    print(f"limit {limit} s (retry after {limit * equivalence.RETRY_AFTER:.2f} s)")
    for r in results:
        print(f"server {'cold' if r['cold_server'] else 'warm-up'}, load {r['load']}: start-up {r['startup_s']:.2f} s, "
              f"retries {r['retries']}, timeouts {r['timeouts']}")
    print("| first comparison of a kind, fresh worker | " + " | ".join(FIRST_OF_A_KIND) + " |")
    print("| --- |" + " --- |" * len(FIRST_OF_A_KIND))
    for r in results:
        print(f"| {'cold server' if r['cold_server'] else 'warm-up'}, load {r['load']} | "
              + " | ".join(f"{r['kinds'][k]['s'] * 1000:.0f} ms" for k in FIRST_OF_A_KIND) + " |")
    print()
    print("| server | load | pass | calls | median | p95 | max | timeouts | > limit + 0.2 s | worst |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in table:
        print(f"| {row['server']} | {row['load']} | {row['pass']} {row['kind']} | {row['calls']} | "
              f"{row['median_s'] * 1000:.1f} ms | {row['p95_s'] * 1000:.1f} ms | {row['max_s'] * 1000:.0f} ms | "
              f"{row['timeouts']} | {row['over_limit_plus_0.2s']} | {'; '.join(row['worst'])} |")


if __name__ == "__main__":
    main()
