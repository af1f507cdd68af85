"""math-verify comparisons in worker processes, each call under a hard time limit.

math-verify's own timeout uses SIGALRM (main thread only) and cannot interrupt a C-level big-integer
operation, so comparisons run in worker processes that are killed when a call overruns. The workers
are forks of one warm fork server (``latex_worker.py``, which says why): a replacement is warm and
ready in milliseconds.

One call, ``compare(gold, pred, symmetric, timeout_s=..., retry_after_s=...)``:

- ``timeout_s`` bounds the whole call from its start: waiting for another thread's call to finish
  (one worker serves one call at a time), forking a worker, and both attempts below. Only the fork
  server's start-up (importing sympy and warming it up: 2-2.5 s here, once per process) happens
  before the clock starts: it is not a comparison, and counting it would turn the first call of every
  process into a timeout (another thread's call that waits meanwhile does count its wait).
- First attempt: the serving worker. If it has not answered after ``retry_after_s``, the pair is
  retried on a fresh warm worker with the rest of the limit, while the first attempt keeps running:
  the first answer wins and the other worker is killed. Racing rather than killing the first attempt
  loses no work when it was merely slow, and the fresh worker wins when the first one was stuck.
- If neither answers by the limit, both are killed and the call returns ``None``: a timeout, which the
  caller reports as such and never caches as a verdict.
- A worker that dies without answering (a crash inside sympy) counts as "not shown equal".

POSIX only (``fork``, selectors and file-descriptor passing on Unix sockets).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo.verify.latex_worker import readable

START_TIMEOUT_S = 120.0  # importing sympy and warming up on a loaded 2-core machine can take a while


@dataclass
class _Worker:
    sock: socket.socket
    pid: int
    buffer: bytes = field(default=b"")

    def kill(self) -> None:
        """Stop a live worker (a dead one is only closed: its pid may already belong to another process)."""
        try:
            os.kill(self.pid, signal.SIGKILL)  # a child of the fork server, which reaps it
        except ProcessLookupError:
            pass
        self.sock.close()


def _read_line(sock: socket.socket, buffer: bytes, deadline: float) -> tuple[bytes | None, bytes]:
    """(one line, the bytes after it); (None, ...) on timeout or end of stream."""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not readable([sock], remaining):
            return None, buffer
        chunk = sock.recv(4096)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, rest = buffer.split(b"\n", 1)
    return line.strip(), rest


class LatexPool:
    """A fork server plus the worker serving calls; the counters say how often the limits bit."""

    def __init__(self, *, cold: bool = False) -> None:
        self._cold = cold  # start the fork server without its warm-up (benchmarks and tests)
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._worker: _Worker | None = None
        self.retries = 0
        self.timeouts = 0

    def compare(self, gold: str, pred: str, symmetric: bool, *, timeout_s: float,
                retry_after_s: float) -> bool | None:
        """Whether math-verify shows ``pred`` equal to ``gold``; None if it could not tell in time."""
        start = time.monotonic()
        if not self._lock.acquire(timeout=max(timeout_s, 0.0)):
            self.timeouts += 1
            return None
        try:
            if self._server is None or self._server.poll() is not None:
                self._start()
                start = time.monotonic()  # the fork server's start-up is off the clock
            request = (json.dumps([gold, pred, symmetric]) + "\n").encode()
            deadline = start + timeout_s
            return self._race(request, min(start + retry_after_s, deadline), deadline)
        finally:
            self._lock.release()

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def forget_after_fork(self) -> None:
        # A forked child must not share the parent's workers (or a lock held by a parent thread).
        self._lock = threading.Lock()
        self._server = self._control = self._worker = None

    def _race(self, request: bytes, retry_at: float, deadline: float) -> bool | None:
        first = self._take_worker(request, deadline)
        if first is None:
            self.timeouts += 1
            return None
        busy = [first]
        winner, reply = self._first_reply(busy, retry_at)
        if winner is None and busy and time.monotonic() < deadline:
            self.retries += 1
            second = self._fork(deadline)
            if second is not None and self._send(second, request):
                busy.append(second)
            winner, reply = self._first_reply(busy, deadline)
        for worker in busy:
            if worker is not winner:
                worker.kill()
        if winner is not None:
            self._worker = winner
            return reply == b"1"
        if busy:  # still computing at the deadline (and now killed)
            self.timeouts += 1
            return None
        return False  # every worker died without an answer: a crash inside sympy, "not shown equal"

    def _take_worker(self, request: bytes, deadline: float) -> _Worker | None:
        """The serving worker (or a new one if there is none, or it died) with ``request`` sent to it."""
        worker, self._worker = self._worker, None
        if worker is not None and self._send(worker, request):
            return worker
        worker = self._fork(deadline)
        return worker if worker is not None and self._send(worker, request) else None

    @staticmethod
    def _send(worker: _Worker, request: bytes) -> bool:
        try:
            worker.sock.sendall(request)
        except OSError:  # it died
            worker.sock.close()
            return False
        return True

    @staticmethod
    def _first_reply(busy: list[_Worker], deadline: float) -> tuple[_Worker | None, bytes]:
        """The first worker of ``busy`` to answer before the deadline, and its answer. Workers found dead
        are closed and removed from ``busy``."""
        while busy:
            remaining = deadline - time.monotonic()
            ready = readable([w.sock for w in busy], remaining) if remaining > 0 else []
            if not ready:
                return None, b""
            for worker in [w for w in busy if w.sock in ready]:
                try:
                    chunk = worker.sock.recv(4096)
                except OSError:
                    chunk = b""
                if not chunk:  # it died
                    worker.sock.close()
                    busy.remove(worker)
                    continue
                worker.buffer += chunk
                if b"\n" in worker.buffer:
                    line, worker.buffer = worker.buffer.split(b"\n", 1)
                    return worker, line.strip()
        return None, b""

    def _fork(self, deadline: float) -> _Worker | None:
        """A new worker, forked by the warm fork server; None if it is not up by the deadline."""
        mine, theirs = socket.socketpair()
        try:
            socket.send_fds(self._control, [b"w"], [theirs.fileno()])
        except OSError:
            mine.close()
            return None
        finally:
            theirs.close()
        pid, rest = _read_line(mine, b"", deadline)
        if pid is None:
            mine.close()  # the worker, if it comes up later, sees the closed socket and exits
            return None
        return _Worker(mine, int(pid), rest)

    def _start(self) -> None:
        self._stop()
        mine, theirs = socket.socketpair()
        script = Path(__file__).with_name("latex_worker.py")
        args = [sys.executable, str(script), str(os.getpid())] + (["--cold"] if self._cold else [])
        # Its own session: when this process dies, the server kills its process group, and only that.
        self._server = subprocess.Popen(args, stdin=theirs.fileno(), start_new_session=True)
        theirs.close()
        self._control = mine
        ready, _ = _read_line(mine, b"", time.monotonic() + START_TIMEOUT_S)
        if ready != b"ready":
            self._stop()
            raise RuntimeError("the math-verify fork server (grpo/verify/latex_worker.py) did not start; "
                               "is math-verify installed?")

    def _stop(self) -> None:
        if self._worker is not None:
            self._worker.kill()
        if self._control is not None:
            self._control.close()  # the server kills its workers and itself on end of stream
        if self._server is not None:
            self._server.kill()
            self._server.wait()
        self._server = self._control = self._worker = None
