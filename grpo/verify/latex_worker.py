"""math-verify in child processes, so that the parent can enforce a hard timeout by killing one.

Started by ``grpo.verify.latex_pool`` as ``python latex_worker.py PARENT_PID [--cold]`` with its
stdin a Unix socket, the control channel (a plain script: it imports only math-verify, never the
project or the parent's ``__main__``). It imports math-verify, compares the ``WARM_UP`` pairs, writes
``ready`` and becomes a fork server: for each socket the parent passes over the control channel
(``SCM_RIGHTS``) it forks a worker that serves comparisons on that socket.

Why a fork server: the first comparison of a new kind of answer in a fresh process pays for sympy's
lazy imports and caches: about 0.3 s for the first polynomial, trigonometric identity or equation in a
fresh worker, under 0.1 s after the warm-up (bench/RESULTS.md), and 1.1-2.1 s each on the loaded
machine of issue 14, which is what made a 1 s limit flip verdicts. ``WARM_UP`` pays those costs once,
in this process; a fork of a warm process is warm, and forking takes milliseconds where a fresh
interpreter takes seconds, so a worker that replaces a killed one is warm at once. ``--cold`` skips
the warm-up (the latency benchmark and a test use it to reproduce a cold worker).

Worker protocol, one line each way: the worker first writes its pid; then, for each request
``["<gold>", "<pred>", symmetric]`` (JSON), it answers ``1`` or ``0`` (symmetric: either direction of
math-verify's ``verify`` suffices). An exception inside math-verify reads as ``0`` (not shown equal).
"""
from __future__ import annotations

import json
import logging
import os
import resource
import selectors
import signal
import socket
import sys

MEMORY_LIMIT_BYTES = 4 << 30  # address space; a MemoryError inside math-verify reads as "not equal"
PARENT_POLL_S = 1.0


def readable(socks: list[socket.socket], timeout_s: float) -> list[socket.socket]:
    """The sockets of ``socks`` with data (or end of stream) within ``timeout_s``. A selector, not
    ``select.select``, which refuses file descriptors past 1024, as a long-lived process has."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        return [key.fileobj for key, _ in selector.select(max(timeout_s, 0.0))]
# One pair of each kind whose first comparison is slow: polynomials (simplify), relations, matrices,
# intervals and unions, sets, roots, trigonometry, equations solved for a variable, logarithms, tuples.
WARM_UP = (
    ("1", "1"),
    ("(x+1)^2", "x^2+2x+1"),
    ("x \\geq 5", "5 \\leq x"),
    ("\\begin{pmatrix}2 & 4\\\\ 6 & 8\\end{pmatrix}", "2\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}"),
    ("(-\\infty, 1) \\cup [2, \\infty)", "[2,\\infty)\\cup(-\\infty,1)"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt2/2"),
    ("\\tan^2(y)+1", "\\sec^2(y)"),
    ("2x+4y-3=0", "y=-\\frac{1}{2}x+\\frac{3}{4}"),
    ("\\log_2 8", "3"),
    ("(1, 2), (3, 4)", "(3,4),(1,2)"),
    ("10\\%", "0.1"),
)


def compare(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    # The parent enforces the timeout: math-verify's own one uses SIGALRM, so it is switched off here.
    gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = parse(f"${pred}$", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _answer(request: bytes) -> bytes:
    gold, pred, symmetric = json.loads(request)
    try:
        result = compare(gold, pred) or (symmetric and compare(pred, gold))
    except Exception:  # noqa: BLE001 - any failure to parse or compare means "not shown equal"
        result = False
    return b"1\n" if result else b"0\n"


def _serve(conn: socket.socket) -> None:
    """A worker: its pid, then one answer per request line, until the parent closes the socket."""
    conn.sendall(f"{os.getpid()}\n".encode())
    buffer = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            conn.sendall(_answer(line))


def _parent_alive(parent_pid: int) -> bool:
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid exists (possibly reused); treat the parent as alive
        pass
    return True


def _fork_workers(control: socket.socket, parent_pid: int) -> None:
    """Fork one worker per socket received, until the parent closes the channel or dies.

    A pathological input (``10^{10^{10}}``) spends its time inside one C-level big-integer operation
    that holds the GIL, so only a kill stops a worker; the parent kills it on timeout. If the parent
    dies abruptly, this process kills its whole process group (itself and every worker). The parent's
    own forks may keep the channel open, so the parent's pid is polled as well.
    """
    while _parent_alive(parent_pid):
        if not readable([control], PARENT_POLL_S):
            continue
        message, fds, _, _ = socket.recv_fds(control, 1, 1)
        if not message:
            break
        if not fds:
            continue
        if os.fork() == 0:
            control.close()
            _serve(socket.socket(fileno=fds[0]))
            os._exit(0)
        os.close(fds[0])
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    parent_pid = int(sys.argv[1])
    control = socket.socket(fileno=os.dup(sys.stdin.fileno()))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    # Anything a library prints lands on stderr instead of the protocol.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.ERROR)
    if "--cold" not in sys.argv:
        for gold, pred in WARM_UP:
            compare(gold, pred)
    control.sendall(b"ready\n")
    _fork_workers(control, parent_pid)


if __name__ == "__main__":
    main()
