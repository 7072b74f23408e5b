"""Event Hubs Capture, as Azure does it: each partition's events written as Avro files to blob storage.

What Azure documents (https://learn.microsoft.com/azure/event-hubs/event-hubs-capture-overview and
https://learn.microsoft.com/azure/event-hubs/explore-captured-avro-files) and this module keeps:
- one Avro object container file per partition per capture window, with the schema in CAPTURE_SCHEMA
  (record `Microsoft.ServiceBus.Messaging.EventData`: SequenceNumber, Offset, EnqueuedTimeUtc,
  SystemProperties, Properties, Body);
- the blob name `{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}`
  (zero-padded, UTC, the window's start) plus `.avro`;
- a window that closes on time or size, whichever comes first, each partition on its own;
- an empty file (header only) for a window without events, unless skip-empty is set.
The Avro encoding is fastavro's; the upload is the azure-storage-blob SDK's (Azurite locally).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import fastavro

from .codec import SEC_DATA, SEC_MESSAGE_ANNOTATIONS, section_value, split_sections
from .store import Broker, Event, Partition

log = logging.getLogger("sandbox.eventhubs.capture")

SEC_APPLICATION_PROPERTIES = 0x74
SEC_AMQP_VALUE = 0x77

# The schema Capture writes, field for field (Microsoft's "explore captured Avro files" page).
_MAP_VALUES = ["long", "double", "string", "bytes"]
CAPTURE_SCHEMA: Dict[str, Any] = {
    "type": "record",
    "name": "EventData",
    "namespace": "Microsoft.ServiceBus.Messaging",
    "fields": [
        {"name": "SequenceNumber", "type": "long"},
        {"name": "Offset", "type": "string"},
        {"name": "EnqueuedTimeUtc", "type": "string"},
        {"name": "SystemProperties", "type": {"type": "map", "values": _MAP_VALUES}},
        {"name": "Properties", "type": {"type": "map", "values": _MAP_VALUES}},
        {"name": "Body", "type": ["null", "bytes"]},
    ],
}
_PARSED_SCHEMA = fastavro.parse_schema(CAPTURE_SCHEMA)

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


def enqueued_time_text(enqueued_ms: int) -> str:
    """EnqueuedTimeUtc as Capture writes it: .NET's invariant UTC text, e.g. `8/31/2017 7:12:14 PM`."""
    at = datetime.fromtimestamp(enqueued_ms / 1000, tz=timezone.utc)
    hour12 = at.hour % 12 or 12
    half = "PM" if at.hour >= 12 else "AM"
    return f"{at.month}/{at.day}/{at.year} {hour12}:{at.minute:02d}:{at.second:02d} {half}"


def _text(value: Any) -> Any:
    """Map values as Avro takes them: int/float/str/bytes; AMQP strings come back from the codec as bytes."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
    return str(value)


def capture_record(event: Event) -> Dict[str, Any]:
    """One stored event as the Avro record Capture writes for it."""
    properties: Dict[str, Any] = {}
    system: Dict[str, Any] = {}
    body = bytearray()
    has_body = False
    for code, raw in split_sections(event.message):
        if code == SEC_APPLICATION_PROPERTIES:
            for key, value in (section_value(raw) or {}).items():
                properties[str(_text(key))] = _text(value)
        elif code == SEC_DATA:
            body += bytes(section_value(raw))
            has_body = True
        elif code == SEC_AMQP_VALUE:
            value = _text(section_value(raw))
            body += value if isinstance(value, bytes) else str(value).encode("utf-8")
            has_body = True
        elif code == SEC_MESSAGE_ANNOTATIONS:
            pass  # the broker's own annotations are the record's top-level fields
    if event.partition_key is not None:
        system["x-opt-partition-key"] = event.partition_key
    return {
        "SequenceNumber": event.sequence_number,
        "Offset": event.offset,
        "EnqueuedTimeUtc": enqueued_time_text(event.enqueued_ms),
        "SystemProperties": system,
        "Properties": properties,
        "Body": bytes(body) if has_body else None,
    }


def avro_file(events: Iterable[Event]) -> bytes:
    """An Avro object container file of these events (header only when there are none)."""
    out = io.BytesIO()
    fastavro.writer(out, _PARSED_SCHEMA, (capture_record(e) for e in events), codec="null")
    return out.getvalue()


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
