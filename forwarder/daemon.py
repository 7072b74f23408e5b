"""The daemon: a list of periodic workers (poller, publisher, heartbeat, and later the approval
reader), each in its own thread, stopped gracefully on SIGTERM/SIGINT.

A worker's step never kills the daemon: an exception is logged and the worker backs off (jittered,
up to 30 s) before trying again. The one exception is `Fatal`: a fault retrying cannot heal (IMDS
refusing the configured request again and again) stops the daemon with its own exit code, so the
service manager does not restart it in a loop. Stopping finishes the current steps, flushes the
outbox to the sink (bounded), and closes the database.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from . import disk_full, logs
from .backoff import Backoff
from .imds import ImdsError, ImdsStopped
from .validation import ValidationUnavailable

log = logs.get("daemon")


class Fatal(Exception):
    """Raised by a step: stop the daemon and exit with `code` (the message is the one line logged)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Worker:
    """`step(stop)` runs every `interval` seconds (fixed rate); interval 0 = the step paces itself."""

    name: str
    step: Callable[[threading.Event], Any]
    interval: float = 0.0
    max_backoff: float = 30.0
    thread: Optional[threading.Thread] = field(default=None, repr=False)
    failures: int = 0
    on_fatal: Optional[Callable[[Fatal], None]] = field(default=None, repr=False)

    def loop(self, stop: threading.Event) -> None:
        backoff = Backoff(base=max(self.interval, 0.5), cap=self.max_backoff)
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.step(stop)
                backoff.reset()
            except ImdsStopped:
                break
            except Fatal as exc:
                if self.on_fatal is not None:
                    self.on_fatal(exc)
                break
            except Exception as exc:  # never dies on a fault: log, back off, go on
                self.failures += 1
                delay = backoff.next_delay()
                fields = logs.fields(worker=self.name, retryIn=round(delay, 2))
                if disk_full.is_disk_full(exc):  # every writer fails alike: one line for all of them
                    if disk_full.NOTICE.full():
                        log.error("the state directory's disk is full: nothing new is accepted until space "
                                  f"is freed; the outbox keeps and sends what it holds ({exc})", extra=fields)
                elif isinstance(exc, (ImdsError, ValidationUnavailable)):  # expected: one line, no traceback
                    log.warning(f"{self.name}: {exc}", extra=fields)
                else:
                    log.exception(f"{self.name} step failed; backing off", extra=fields)
                stop.wait(delay)
                next_at = time.monotonic()
                continue
            if self.interval > 0:
                next_at += self.interval
                now = time.monotonic()
                if next_at < now:  # fell behind (slow IMDS): do not burst to catch up
                    next_at = now
                stop.wait(next_at - now)


class Daemon:
    def __init__(self, on_close: Optional[List[Callable[[], None]]] = None,
                 join_timeout: float = 10.0) -> None:
        self.workers: List[Worker] = []
        self.stop = threading.Event()
        self.on_close: List[Callable[[], None]] = list(on_close or [])  # run in order after workers stop
        self.join_timeout = join_timeout
        self.exit_code = 0

    def add_worker(self, name: str, step: Callable[[threading.Event], Any], interval: float = 0.0) -> Worker:
        worker = Worker(name=name, step=step, interval=interval, on_fatal=self.fail)
        self.workers.append(worker)
        return worker

    def fail(self, fatal: Fatal) -> None:
        """Stop everything; `run()` returns `fatal.code` after the usual clean shutdown."""
        if not self.stop.is_set():
            log.error(str(fatal), extra=logs.fields(exitCode=fatal.code))
            self.exit_code = fatal.code
            self.stop.set()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            log.info("stopping", extra=logs.fields(signal=signal.Signals(signum).name))
            self.stop.set()
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> int:
        """Start every worker; block until stopped; then close. Returns the exit code (0, or a Fatal's)."""
        log.info("started", extra=logs.fields(workers=[w.name for w in self.workers]))
        for worker in self.workers:
            worker.thread = threading.Thread(target=worker.loop, args=(self.stop,), name=worker.name,
                                             daemon=True)
            worker.thread.start()
        while not self.stop.is_set():
            self.stop.wait(1.0)  # signals are handled on the main thread between waits
        deadline = time.monotonic() + self.join_timeout
        for worker in self.workers:
            if worker.thread is not None:
                worker.thread.join(max(0.0, deadline - time.monotonic()))
                if worker.thread.is_alive():
                    log.warning("worker still busy at shutdown; its step is abandoned (state is durable)",
                                extra=logs.fields(worker=worker.name))
        for close in self.on_close:
            try:
                close()
            except Exception:
                log.exception("error while closing")
        log.info("stopped", extra=logs.fields(exitCode=self.exit_code))
        return self.exit_code
