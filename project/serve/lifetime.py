"""The server's processes live and answer only while its main process does: parent death, heartbeat, answer timeout.

When the main ``serve`` process dies without a shutdown (SIGKILL, the OOM killer), LitServe leaves its HTTP servers,
its Manager and its inference workers running: the port stays taken, ``/health`` says 200 and ``/predict`` waits
forever, because the answers travelled through the dead process. Here every child ends with the main process, a
worker that stops answering turns ``/health`` into 503, and a request without an answer gets its 504.
"""

import asyncio
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from starlette.responses import JSONResponse

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent(parent_pid: int) -> None:
    """Have this process killed when ``parent_pid``, its parent, exits; at once if it already has.

    Linux: the kernel sends SIGKILL (``prctl(PR_SET_PDEATHSIG)``) when the thread that forked this process ends, so
    fork from the main thread. Elsewhere a daemon thread looks for the parent twice a second.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:  # it died before prctl took effect
            os._exit(1)
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def forks_end_with_this_process() -> None:
    """Every process forked from here from now on (LitServe's HTTP servers and Manager) ends with this one."""
    parent = os.getpid()

    def in_child() -> None:
        if os.getppid() == parent:  # not a grandchild forked by one of them
            end_with_parent(parent)

    os.register_at_fork(after_in_child=in_child)


class Heartbeat:
    """A time in shared memory that inference workers renew and HTTP servers read.

    Made in the main process before the workers are spawned and the HTTP servers forked: both inherit it.

    Args:
        every: Seconds between two beats.
        late: A beat older than this many seconds means no worker answers.
    """

    def __init__(self, every: float = 0.5, late: float = 3.0):
        self.every, self.late = every, late
        # CLOCK_MONOTONIC is one clock for every process of the machine.
        self.last = multiprocessing.get_context("spawn").Value("d", 0.0, lock=False)

    def start(self) -> None:
        """Beat from a daemon thread of this process (an inference worker, once its model is loaded)."""

        def beat() -> None:
            while True:
                self.last.value = time.monotonic()
                time.sleep(self.every)

        threading.Thread(target=beat, daemon=True, name="heartbeat").start()

    def alive(self) -> bool:
        return time.monotonic() - self.last.value < self.late


class AnswerWithin:
    """ASGI middleware: a request to ``path`` that has no answer after ``seconds`` gets a 504.

    LitServe's own timeout is applied by an inference worker when it takes a request that waited too long; with no
    worker left to take it, the HTTP server would wait forever. The abandoned request's entry stays in LitServe's
    response buffer (a few hundred bytes per timed-out request).

    Args:
        app: The ASGI application to wrap.
        seconds: How long a request may wait for its answer.
        path: The route it applies to.
    """

    def __init__(self, app: Any, seconds: float, path: str = "/predict"):
        self.app, self.seconds, self.path = app, seconds, path

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, tracked), self.seconds)
        except TimeoutError:
            if started:  # an answer was being written: nothing else can be said on this connection
                return
            detail = f"no answer within --timeout {self.seconds:g} s: no inference worker took the request"
            await JSONResponse({"detail": detail}, status_code=504)(scope, receive, send)
