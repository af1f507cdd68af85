"""math-verify in a child process, so that the parent can enforce a hard timeout by killing it.

Started by ``grpo.verify.equivalence`` as ``python latex_worker.py PARENT_PID`` (a plain script: the
child imports only math-verify, never the project or the parent's ``__main__``). Protocol, one line each way:
the parent writes ``["<gold>", "<pred>", symmetric]`` as JSON, the worker answers ``1`` or ``0``
(symmetric: either direction of math-verify's ``verify`` suffices). The worker first
writes ``ready`` once math-verify is imported and warmed up, so start-up time never eats a call's timeout.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import time

MEMORY_LIMIT_BYTES = 4 << 30  # address space; a MemoryError inside math-verify reads as "not equal"


def compare(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    # The parent enforces the timeout: math-verify's own one uses SIGALRM, so it is switched off here.
    gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = parse(f"${pred}$", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _contain_runaways(parent_pid: int) -> None:
    """Bound what one runaway comparison can cost, and never outlive the parent.

    A pathological input (``10^{10^{10}}``) spends its time inside one C-level big-integer operation
    that holds the GIL, so neither a signal handler nor a thread of this process can stop it. The
    parent kills the worker on timeout; if the parent itself dies abruptly, a forked watchdog process
    (no GIL to wait for) kills the worker. The address-space cap turns memory blow-ups into MemoryError.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    worker_pid = os.getpid()
    if os.fork() != 0:
        return
    # The watchdog must not hold the protocol pipes open, or the parent would not see the worker die.
    os.close(0)
    os.close(1)
    while os.getppid() == worker_pid:  # reparented once the worker is gone: then just exit
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os.kill(worker_pid, signal.SIGKILL)
            break
        except PermissionError:  # the pid exists (possibly reused); treat the parent as alive
            pass
        time.sleep(1.0)
    os._exit(0)


def main() -> None:
    _contain_runaways(int(sys.argv[1]))
    # Replies go through a private copy of stdout; anything a library prints lands on stderr instead
    # of corrupting the protocol.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.ERROR)
    compare("1", "1")
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        gold, pred, symmetric = json.loads(line)
        try:
            result = compare(gold, pred) or (symmetric and compare(pred, gold))
        except Exception:  # noqa: BLE001 - any failure to parse or compare means "not shown equal"
            result = False
        replies.write("1\n" if result else "0\n")
        replies.flush()


if __name__ == "__main__":
    main()
