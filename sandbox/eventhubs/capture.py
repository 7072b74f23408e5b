"""Event Hubs Capture, as Azure does it: each partition's events written as Avro files to blob storage.

What Azure documents (https://learn.microsoft.com/azure/event-hubs/event-hubs-capture-overview and
https://learn.microsoft.com/azure/event-hubs/explore-captured-avro-files) and this module keeps:
- one Avro object container file per partition per capture window, written as Azure writes it
  (capture_file.py: the header's schema text, the records, the property types);
- the blob name `{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}`
  (zero-padded, UTC, the window's start) plus `.avro`;
- a window that closes on time or size, whichever comes first, each partition on its own;
- an empty file (header only) for a window without events, unless skip-empty is set.
The upload is the azure-storage-blob SDK's (Azurite locally).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional, Tuple

from .capture_file import CAPTURE_SCHEMA, CAPTURE_SCHEMA_TEXT, avro_file, capture_record, enqueued_time_text
from .store import Broker, Event, Partition

__all__ = ["CAPTURE_SCHEMA", "CAPTURE_SCHEMA_TEXT", "Capture", "CaptureSettings", "avro_file", "blob_name",
           "capture_record", "check_name_format", "enqueued_time_text"]

log = logging.getLogger("sandbox.eventhubs.capture")

DEFAULT_NAME_FORMAT = "{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}"
NAME_FIELDS = ("Namespace", "EventHub", "PartitionId", "Year", "Month", "Day", "Hour", "Minute", "Second")
DEFAULT_CONTAINER = "eventhub-capture"  # the container infra/ creates for Capture
DEFAULT_INTERVAL = 300.0  # Azure's default window; Azure allows 60..900 s, the sandbox any >= 1
DEFAULT_SIZE_LIMIT = 314_572_800  # Azure's default window size (300 MiB)


@dataclass(frozen=True)
class CaptureSettings:
    connection_string: str
    container: str = DEFAULT_CONTAINER
    namespace: str = "sandbox"
    interval_seconds: float = DEFAULT_INTERVAL
    size_limit_bytes: int = DEFAULT_SIZE_LIMIT
    skip_empty: bool = False
    name_format: str = DEFAULT_NAME_FORMAT
    hubs: Tuple[str, ...] = ()  # the hubs captured (Azure configures Capture per hub); empty: every hub


def check_name_format(fmt: str) -> Optional[str]:
    """Why `fmt` cannot be a Capture name format (Azure requires every field), or None if it can."""
    missing = [name for name in NAME_FIELDS if "{" + name + "}" not in fmt]
    if missing:
        return "must contain every one of " + ", ".join("{" + n + "}" for n in NAME_FIELDS) + \
            " (missing " + ", ".join("{" + n + "}" for n in missing) + ")"
    try:
        blob_name(fmt, "ns", "hub", "0", datetime(2000, 1, 1, tzinfo=timezone.utc))
    except (KeyError, IndexError, ValueError) as exc:
        return f"cannot be filled in ({exc}); only the fields above may appear in braces"
    return None


def blob_name(fmt: str, namespace: str, hub: str, partition_id: str, window_start: datetime) -> str:
    """The blob a window is written to: the name format filled in (zero-padded UTC) plus `.avro`."""
    at = window_start.astimezone(timezone.utc)
    return fmt.format(Namespace=namespace, EventHub=hub, PartitionId=partition_id,
                      Year=f"{at.year:04d}", Month=f"{at.month:02d}", Day=f"{at.day:02d}",
                      Hour=f"{at.hour:02d}", Minute=f"{at.minute:02d}", Second=f"{at.second:02d}") + ".avro"


class _Window:
    """One partition's open capture window: from `start` (wall clock), events from sequence `next`."""

    def __init__(self, partition: Partition, start: float, next_sequence: int) -> None:
        self.partition = partition
        self.start = start
        self.next = next_sequence

    def pending(self) -> List[Event]:
        return self.partition.read(self.next, self.partition.next_sequence - self.next)


class Capture:
    """Writes every hub's partitions to blob storage window by window; positions survive restarts
    when the broker persists (`<data-dir>/<hub>/capture-<n>.json`)."""

    def __init__(self, broker: Broker, settings: CaptureSettings, data_dir: Optional[Path] = None) -> None:
        from azure.storage.blob import BlobServiceClient  # only the capture path needs the blob SDK

        self.settings = settings
        self.data_dir = data_dir
        self._service = BlobServiceClient.from_connection_string(settings.connection_string)
        self._container = self._service.get_container_client(settings.container)
        now = time.time()
        self._windows: List[Tuple[str, _Window]] = []
        for hub in broker.hubs.values():
            if settings.hubs and hub.name not in settings.hubs:
                continue
            for partition in hub.partitions:
                start_at = self._load_position(hub.name, partition)
                self._windows.append((hub.name, _Window(partition, now, start_at)))
        self.files_written = 0

    # ---- positions
    def _position_path(self, hub: str, partition: Partition) -> Optional[Path]:
        return self.data_dir / hub / f"capture-{partition.id}.json" if self.data_dir is not None else None

    def _load_position(self, hub: str, partition: Partition) -> int:
        path = self._position_path(hub, partition)
        if path is not None and path.exists():
            try:
                return int(json.loads(path.read_text())["next"])
            except (ValueError, KeyError, TypeError):
                log.warning("capture position %s unreadable; capturing that partition from its start", path)
        return partition.begin_sequence

    def _save_position(self, hub: str, window: _Window) -> None:
        path = self._position_path(hub, window.partition)
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"next": window.next}))
        os.replace(tmp, path)

    # ---- writing
    def ensure_container(self) -> None:
        from azure.core.exceptions import ResourceExistsError

        try:
            self._container.create_container()
        except ResourceExistsError:
            pass

    def _due(self, window: _Window, now: float) -> bool:
        if int(now) <= int(window.start):
            return False  # names have one-second resolution: a second window in the same second would clash
        if now - window.start >= self.settings.interval_seconds:
            return True
        size = sum(len(e.message) for e in window.pending())
        return size >= self.settings.size_limit_bytes

    def _upload(self, name: str, events: List[Event]) -> None:
        self._container.upload_blob(name, avro_file(events), overwrite=True)

    async def _close_window(self, hub: str, window: _Window, now: float, closing: bool = False) -> None:
        """Write one window. Events are read here, on the loop that appends them (a deque must not be read
        from another thread while it grows); encoding and upload run in a thread."""
        events = window.pending()
        if window.partition.begin_sequence > window.next:
            log.error("capture of %s/%s fell behind retention: events %d..%d were evicted before capture",
                      hub, window.partition.id, window.next, window.partition.begin_sequence - 1)
        if events or not (self.settings.skip_empty or closing):
            name = blob_name(self.settings.name_format, self.settings.namespace, hub, window.partition.id,
                             datetime.fromtimestamp(window.start, tz=timezone.utc))
            await asyncio.to_thread(self._upload, name, events)
            self.files_written += 1
            log.info("captured %d event(s) of %s/%s to %s/%s", len(events), hub, window.partition.id,
                     self.settings.container, name)
        if events:
            window.next = events[-1].sequence_number + 1
            self._save_position(hub, window)
        window.start = now

    async def tick(self, now: Optional[float] = None) -> None:
        """Close every window that is due. A failed upload leaves the window open (retried next tick),
        as Azure keeps the data in the hub and back-fills once storage is reachable again."""
        now = time.time() if now is None else now
        for hub, window in self._windows:
            if self._due(window, now):
                try:
                    await self._close_window(hub, window, now)
                except Exception as exc:  # noqa: BLE001 - storage down or refusing: retry on the next tick
                    log.warning("capture of %s/%s not written (retrying): %s", hub, window.partition.id, exc)

    async def flush(self) -> None:
        """On shutdown: write every open window that holds events (Azure never stops; the sandbox does)."""
        now = time.time()
        for hub, window in self._windows:
            if window.pending():
                try:
                    await self._close_window(hub, window, now, closing=True)
                except Exception as exc:  # noqa: BLE001 - stopping anyway; the events stay in the log
                    log.warning("capture of %s/%s not flushed on stop: %s", hub, window.partition.id, exc)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop` is set, then flush what is open."""
        step = min(1.0, max(0.05, self.settings.interval_seconds / 4))
        ready = False
        while not stop.is_set():
            if not ready:
                try:
                    await asyncio.to_thread(self.ensure_container)
                    ready = True
                except Exception as exc:  # noqa: BLE001 - storage not up yet: try again next step
                    log.warning("capture container %s not reachable yet: %s", self.settings.container, exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=step)
            except asyncio.TimeoutError:
                pass
            if ready and not stop.is_set():
                await self.tick()
        if ready:
            await self.flush()
        await asyncio.to_thread(self._service.close)
