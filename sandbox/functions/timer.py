"""Timer triggers on their NCRONTAB schedule (6 fields, seconds first) or a TimeSpan interval."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Callable, Optional

from azure.functions.timer import TimerRequest
from croniter import croniter

from .hostconfig import timespan_seconds
from .loader import FunctionSpec
from .retry import RetryPolicy, Stopped
from .settings import AppSettings

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
    """Fires the function at each occurrence; occurrences missed while it ran fire once, past due."""

    def __init__(
        self, spec: FunctionSpec, settings: AppSettings, retry: RetryPolicy, stop: threading.Event
    ) -> None:
        self.spec = spec
        self.schedule = str(settings.resolve(spec.trigger["schedule"]))
        self.next_after = next_occurrence_function(self.schedule)
        self.run_on_startup = bool(spec.trigger.get("runOnStartup", False))
        self.retry = retry
        self.stop = stop
        self.thread: Optional[threading.Thread] = None

    def describe(self) -> str:
        return f"timerTrigger schedule={self.schedule!r}"

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name=f"timer-{self.spec.name}", daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def _loop(self) -> None:
        last: Optional[datetime] = None
        if self.run_on_startup:
            self._fire(datetime.now(timezone.utc), last, past_due=False, reason="RunOnStartup")
        due = self.next_after(datetime.now(timezone.utc))
        while not self.stop.is_set():
            if self.stop.wait(max(0.0, (due - datetime.now(timezone.utc)).total_seconds())):
                return
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
