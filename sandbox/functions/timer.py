"""Timer triggers on their NCRONTAB schedule (6 fields, seconds first) or a TimeSpan interval, each a
singleton across the runners that share AzureWebJobsStorage and the host id (singleton.py)."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Callable, Optional

from azure.functions.timer import TimerRequest
from croniter import croniter

from .hostconfig import SingletonOptions, timespan_seconds
from .loader import FunctionSpec
from .retry import RetryPolicy, Stopped
from .settings import AppSettings
from .singleton import ListenerLock

log = logging.getLogger("sandbox.functions")


def next_occurrence_function(schedule: str) -> Callable[[datetime], datetime]:
    """`after -> next fire time` for an NCRONTAB expression or a TimeSpan (`hh:mm:ss`)."""
    fields = schedule.split()
    if len(fields) == 6:
        if not croniter.is_valid(schedule, second_at_beginning=True):
            raise ValueError(f"timer schedule {schedule!r} is not a valid NCRONTAB expression")
        return lambda after: croniter(schedule, after, second_at_beginning=True).get_next(datetime)
    if len(fields) == 1 and ":" in schedule:
        interval = timespan_seconds(schedule) or 0.0
        if interval <= 0:
            raise ValueError(f"timer interval {schedule!r} must be positive")
        return lambda after: after + timedelta(seconds=interval)
    raise ValueError(
        f"timer schedule {schedule!r}: NCRONTAB needs 6 fields "
        "({second} {minute} {hour} {day} {month} {day-of-week}) or a TimeSpan hh:mm:ss"
    )


class TimerTrigger:
    """Fires the function at each occurrence while this runner holds the function's listener lock;
    occurrences missed while it ran fire once, past due. Without the lock it polls for it."""

    def __init__(
        self,
        spec: FunctionSpec,
        settings: AppSettings,
        retry: RetryPolicy,
        stop: threading.Event,
        host_id: str,
        singleton: SingletonOptions,
    ) -> None:
        self.spec = spec
        self.schedule = str(settings.resolve(spec.trigger["schedule"]))
        self.next_after = next_occurrence_function(self.schedule)
        self.run_on_startup = bool(spec.trigger.get("runOnStartup", False))
        self.retry = retry
        self.stop = stop
        self.recovery_interval = singleton.listener_lock_recovery_polling_interval
        self.lock = ListenerLock(settings, host_id, spec.name, singleton)
        self.thread: Optional[threading.Thread] = None

    def describe(self) -> str:
        return f"timerTrigger schedule={self.schedule!r} singleton={self.lock.blob_name!r}"

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name=f"timer-{self.spec.name}", daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                if not self._acquire():
                    log.info("Unable to acquire Singleton lock (%s).", self.lock.blob_name)
                    self.stop.wait(self.recovery_interval)
                    continue
                log.info("Singleton lock acquired (%s): the timer runs here", self.lock.blob_name)
                self._run_schedule()
                if not self.stop.is_set():
                    log.warning("Singleton lock lost (%s): the timer stops here", self.lock.blob_name)
                    self.lock.release()
        finally:
            self.lock.close()  # after the last invocation returned, as the host releases it

    def _acquire(self) -> bool:
        try:
            return self.lock.acquire()
        except Exception as exc:  # noqa: BLE001 - storage unreachable: try again at the next poll
            log.warning("Singleton lock %s not acquired: %s: %s",
                        self.lock.blob_name, type(exc).__name__, exc)
            return False

    def _run_schedule(self) -> None:
        """The schedule, from now (the host starts the listener when it gets the lock), until the runner
        stops or the lock is lost. An invocation starts only while the lease surely lasts."""
        last: Optional[datetime] = None
        if self.run_on_startup:
            self._fire(datetime.now(timezone.utc), last, past_due=False, reason="RunOnStartup")
        due = self.next_after(datetime.now(timezone.utc))
        while not self.stop.is_set() and self.lock.held:
            wait = (due - datetime.now(timezone.utc)).total_seconds()
            if wait > 0:
                self.stop.wait(min(wait, 1.0))  # wake each second: a lost lock stops the schedule
                continue
            now = datetime.now(timezone.utc)
            # More than one occurrence elapsed (the function ran long): fire once, flagged past due.
            past_due = self.next_after(due) <= now
            self._fire(due, last, past_due=past_due, reason="Timer")
            last = due
            due = self.next_after(max(due, datetime.now(timezone.utc)))

    def _fire(self, scheduled: datetime, last: Optional[datetime], past_due: bool, reason: str) -> None:
        timer = TimerRequest(
            past_due=past_due,
            schedule={"AdjustForDST": True},
            schedule_status={
                "Last": last.isoformat() if last else None,
                "Next": scheduled.isoformat(),
                "LastUpdated": datetime.now(timezone.utc).isoformat(),
            },
        )
        argument = str(self.spec.trigger["name"])
        try:
            self.retry.run(lambda: self.spec.invoke(reason, **{argument: timer}), self.stop, self.spec.name)
        except Stopped:
            return
        except Exception:  # noqa: BLE001 - logged by invoke(); a failed run never stops the schedule
            return
