"""Hubs, partitions and their events: in memory (bounded), optionally persisted append-only per partition.

Offsets are the sequence number written as a decimal string (real Event Hubs uses byte positions;
clients treat offsets as opaque strings, so either works). Persisted records are fsync'd before a send
is acknowledged.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Deque, Dict, Iterable, List, Optional, Sequence

DEFAULT_MAX_EVENTS = 100_000  # per partition, oldest evicted first
_RECORD = struct.Struct(">IqqH")  # message length, sequence number, enqueued ms, partition-key length


@dataclass(frozen=True)
class Event:
    sequence_number: int
    enqueued_ms: int
    partition_key: Optional[str]
    message: bytes  # the whole encoded AMQP message, annotations included, as delivered

    @property
    def offset(self) -> str:
        return str(self.sequence_number)


class Partition:
    """One partition's log. Waiters are woken by an asyncio.Event replaced on every append (no polling)."""

    def __init__(self, hub: str, partition_id: str, max_events: int, path: Optional[Path]) -> None:
        self.hub = hub
        self.id = partition_id
        self.events: Deque[Event] = deque(maxlen=max_events)
        self.next_sequence = 0
        self._changed = asyncio.Event()
        self._file = None
        if path is not None:
            self._load(path)
            self._file = open(path, "ab")

    # ---- reading
    @property
    def begin_sequence(self) -> int:
        return self.events[0].sequence_number if self.events else self.next_sequence

    @property
    def last(self) -> Optional[Event]:
        return self.events[-1] if self.events else None

    def read(self, from_sequence: int, limit: int) -> List[Event]:
        if not self.events or limit <= 0:
            return []
        start = max(from_sequence - self.events[0].sequence_number, 0)
        return list(itertools.islice(self.events, start, start + limit))

    def first_after_time(self, ms: int, inclusive: bool) -> int:
        for event in self.events:
            if event.enqueued_ms > ms or (inclusive and event.enqueued_ms == ms):
                return event.sequence_number
        return self.next_sequence

    async def wait_beyond(self, sequence: int) -> None:
        """Return once an event with sequence number >= `sequence` exists (the caller re-checks)."""
        if self.next_sequence > sequence:
            return
        await self._changed.wait()

    # ---- writing
    def append(self, messages: Sequence[bytes], keys: Sequence[Optional[str]], build) -> List[Event]:
        """Append messages; `build(message, seq, ms, key)` returns the message as delivered."""
        now = int(time.time() * 1000)
        if self.events:
            now = max(now, self.events[-1].enqueued_ms)  # enqueued time never goes backwards
        out = []
        for message, key in zip(messages, keys):
            seq = self.next_sequence
            event = Event(seq, now, key, build(message, seq, now, key))
            self.next_sequence += 1
            self.events.append(event)
            out.append(event)
        if self._file is not None:
            self._persist(out)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return out

    def _persist(self, events: Iterable[Event]) -> None:
        assert self._file is not None
        for event in events:
            key = (event.partition_key or "").encode("utf-8")
            key_len = len(key) if event.partition_key is not None else 0xFFFF
            head = _RECORD.pack(len(event.message), event.sequence_number, event.enqueued_ms, key_len)
            self._file.write(head)
            self._file.write(key + event.message)
        self._file.flush()
        os.fsync(self._file.fileno())

    def _load(self, path: Path) -> None:
        if not path.exists():
            return
        data = path.read_bytes()
        pos = good = 0
        while pos + _RECORD.size <= len(data):
            length, seq, ms, key_len = _RECORD.unpack_from(data, pos)
            key_size = 0 if key_len == 0xFFFF else key_len
            end = pos + _RECORD.size + key_size + length
            if end > len(data):
                break  # a torn last record (crash mid-write): dropped, it was never acknowledged
            key_bytes = data[pos + _RECORD.size: pos + _RECORD.size + key_size]
            key = None if key_len == 0xFFFF else key_bytes.decode("utf-8")
            self.events.append(Event(seq, ms, key, data[end - length:end]))
            self.next_sequence = seq + 1
            pos = good = end
        if good < len(data):
            with open(path, "r+b") as f:
                f.truncate(good)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class Hub:
    name: str
    partitions: List[Partition]
    consumer_groups: Optional[List[str]]  # None: any name is accepted
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    _round_robin: int = 0

    @property
    def partition_ids(self) -> List[str]:
        return [p.id for p in self.partitions]

    def partition(self, partition_id: str) -> Optional[Partition]:
        for p in self.partitions:
            if p.id == partition_id:
                return p
        return None

    def has_consumer_group(self, name: str) -> bool:
        return self.consumer_groups is None or name == "$Default" or name.lower() in self.consumer_groups

    def pick(self, partition_key: Optional[str]) -> Partition:
        """Same key, same partition (a stable hash, not Azure's); no key: round robin."""
        if partition_key is not None:
            return self.partitions[zlib.crc32(partition_key.encode("utf-8")) % len(self.partitions)]
        self._round_robin = (self._round_robin + 1) % len(self.partitions)
        return self.partitions[self._round_robin]


class Broker:
    def __init__(self) -> None:
        self.hubs: Dict[str, Hub] = {}

    def add_hub(self, name: str, partitions: int, consumer_groups: Optional[List[str]] = None,
                data_dir: Optional[Path] = None, max_events: int = DEFAULT_MAX_EVENTS) -> Hub:
        parts = []
        created = int(time.time() * 1000)
        if data_dir is not None:
            hub_dir = data_dir / name
            hub_dir.mkdir(parents=True, exist_ok=True)
            created_file = hub_dir / "created_ms"
            if created_file.exists():
                created = int(created_file.read_text().strip())
            else:
                created_file.write_text(str(created))
        for i in range(partitions):
            path = data_dir / name / f"partition-{i}.log" if data_dir is not None else None
            parts.append(Partition(name, str(i), max_events, path))
        groups = [g.lower() for g in consumer_groups] if consumer_groups else None
        hub = Hub(name, parts, groups, created)
        self.hubs[name.lower()] = hub
        return hub

    def hub(self, name: str) -> Optional[Hub]:
        return self.hubs.get(name.lower())

    def close(self) -> None:
        for hub in self.hubs.values():
            for p in hub.partitions:
                p.close()
