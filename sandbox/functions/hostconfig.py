"""The parts of host.json the runner honours, with the host's defaults where host.json is silent."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)$")


def timespan_seconds(value: Optional[str], default: Optional[float] = None) -> Optional[float]:
    """A .NET TimeSpan string (`[d.]hh:mm:ss[.fff]`) in seconds."""
    if value is None:
        return default
    match = _TIMESPAN.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a TimeSpan (expected [d.]hh:mm:ss)")
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@dataclass(frozen=True)
class EventHubOptions:
    """`extensions.eventHubs` (Event Hubs extension 5.x names and defaults)."""

    max_event_batch_size: int = 100
    min_event_batch_size: int = 1  # > 1: wait (at most max_wait_time) for this many before invoking
    max_wait_time: float = 60.0
    prefetch_count: int = 300
    batch_checkpoint_frequency: int = 1
    initial_offset: str = "fromStart"  # fromStart | fromEnd | fromEnqueuedTime
    initial_enqueued_time_utc: Optional[str] = None


# Azure Storage's lease bounds, which the host enforces on its singleton lock periods.
MIN_LEASE, MAX_LEASE = 15.0, 60.0


@dataclass(frozen=True)
class SingletonOptions:
    """host.json `singleton` with the host's defaults (WebJobs SDK SingletonOptions). The runner uses the
    listener ones: a timer trigger's listener runs on one instance at a time, under a blob lease."""

    lock_period: float = MIN_LEASE
    listener_lock_period: float = MAX_LEASE
    listener_lock_recovery_polling_interval: float = 60.0
    lock_acquisition_timeout: Optional[float] = None  # TimeSpan.MaxValue
    lock_acquisition_polling_interval: float = 5.0

    @classmethod
    def from_mapping(cls, raw: Dict[str, Any]) -> SingletonOptions:
        defaults = cls()

        def seconds(key: str, default: Optional[float]) -> Optional[float]:
            return timespan_seconds(raw.get(key), default)

        options = cls(
            lock_period=seconds("lockPeriod", defaults.lock_period) or 0.0,
            listener_lock_period=seconds("listenerLockPeriod", defaults.listener_lock_period) or 0.0,
            listener_lock_recovery_polling_interval=seconds(
                "listenerLockRecoveryPollingInterval", defaults.listener_lock_recovery_polling_interval
            ) or 0.0,
            lock_acquisition_timeout=seconds("lockAcquisitionTimeout", defaults.lock_acquisition_timeout),
            lock_acquisition_polling_interval=seconds(
                "lockAcquisitionPollingInterval", defaults.lock_acquisition_polling_interval
            ) or 0.0,
        )
        for name in ("lockPeriod", "listenerLockPeriod"):
            value = options.lock_period if name == "lockPeriod" else options.listener_lock_period
            if not MIN_LEASE <= value <= MAX_LEASE:
                raise ValueError(f"host.json singleton.{name} must be 00:00:15 .. 00:01:00 (a blob lease)")
        if options.listener_lock_recovery_polling_interval < MIN_LEASE:
            raise ValueError("host.json singleton.listenerLockRecoveryPollingInterval must be >= 00:00:15")
        return options

    def takeover_seconds(self) -> Tuple[float, float]:
        """(fastest, slowest) seconds from the holder's crash until another instance holds the timer: the
        lease runs out (renewed every half period, so half to a whole period after the last renewal),
        then the standby's next recovery poll."""
        return (self.listener_lock_period / 2,
                self.listener_lock_period + self.listener_lock_recovery_polling_interval)


@dataclass(frozen=True)
class HostConfig:
    route_prefix: str = "api"
    event_hubs: EventHubOptions = EventHubOptions()
    singleton: SingletonOptions = SingletonOptions()
    retry: Optional[Dict[str, Any]] = None
    raw: Optional[Dict[str, Any]] = None

    @classmethod
    def load(cls, path: Optional[Path]) -> HostConfig:
        if path is None or not Path(path).exists():
            return cls()
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        if raw.get("version") != "2.0":
            raise ValueError(f'{path}: host.json needs "version": "2.0"')
        extensions = raw.get("extensions", {})
        hubs = extensions.get("eventHubs", {})
        offset = hubs.get("initialOffsetOptions", {})
        defaults = EventHubOptions()
        options = EventHubOptions(
            max_event_batch_size=int(hubs.get("maxEventBatchSize", defaults.max_event_batch_size)),
            min_event_batch_size=int(hubs.get("minEventBatchSize", defaults.min_event_batch_size)),
            max_wait_time=float(timespan_seconds(hubs.get("maxWaitTime"), defaults.max_wait_time) or 0),
            prefetch_count=int(hubs.get("prefetchCount", defaults.prefetch_count)),
            batch_checkpoint_frequency=int(
                hubs.get("batchCheckpointFrequency", defaults.batch_checkpoint_frequency)
            ),
            initial_offset=str(offset.get("type", defaults.initial_offset)),
            initial_enqueued_time_utc=offset.get("enqueuedTimeUtc"),
        )
        route_prefix = extensions.get("http", {}).get("routePrefix", "api")
        return cls(
            route_prefix=str(route_prefix).strip("/"),
            event_hubs=options,
            singleton=SingletonOptions.from_mapping(raw.get("singleton") or {}),
            retry=raw.get("retry"),
            raw=raw,
        )
