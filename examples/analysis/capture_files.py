"""Capture's Avro files -> the envelopes inside them, deduplicated on the CloudEvents `id`.

Sources: a blob container (the azure-storage-blob SDK: Azure with a credential, or Azurite with its
connection string) or a local directory of downloaded `.avro` files. Nothing here is specific to the
sandbox: real Capture files read the same way.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Tuple

import fastavro

import schemas

ENVELOPE_SCHEMA = "envelope.schema.json"


@dataclass
class Envelopes:
    """What a set of Capture files held: each distinct envelope once, and what was set aside."""

    items: List[Dict[str, Any]] = field(default_factory=list)
    enqueued: Dict[str, str] = field(default_factory=dict)  # envelope id -> the hub's EnqueuedTimeUtc
    files: int = 0
    records: int = 0
    duplicates: int = 0  # same `id` seen again: a resend (at-least-once delivery), counted once
    unreadable: int = 0  # body not JSON
    invalid: int = 0  # JSON but not a valid envelope (schemas/envelope.schema.json)


def export_lines(found: Envelopes) -> Iterator[str]:
    """JSON lines {"body": <envelope>, "enqueuedTime": ...}: what `se-policy whatif --from` replays."""
    for envelope in found.items:
        line = {"body": envelope, "enqueuedTime": _iso(found.enqueued.get(envelope["id"], ""))}
        yield json.dumps(line, separators=(",", ":")) + "\n"


def _iso(capture_time: str) -> str:
    """Capture's EnqueuedTimeUtc ("11/24/2026 10:15:02 AM") -> ISO 8601; '' when absent or unreadable."""
    from datetime import datetime, timezone

    for pattern in ("%m/%d/%Y %I:%M:%S %p", "%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            moment = datetime.strptime(capture_time, pattern).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return ""


def records_in(avro_bytes: bytes) -> Iterator[Dict[str, Any]]:
    """The EventData records of one Capture file (an empty window's file has none)."""
    yield from fastavro.reader(io.BytesIO(avro_bytes))


def container_files(container: Any, prefix: str = "") -> Iterator[Tuple[str, bytes]]:
    """(blob name, bytes) of every `.avro` blob under `prefix`, in name order (= partition, then time)."""
    names = sorted(b.name for b in container.list_blobs(name_starts_with=prefix or None)
                   if b.name.endswith(".avro"))
    for name in names:
        yield name, container.download_blob(name).readall()


def directory_files(root: Path) -> Iterator[Tuple[str, bytes]]:
    for path in sorted(root.rglob("*.avro")):
        yield str(path.relative_to(root)), path.read_bytes()


def envelopes(files: Iterable[Tuple[str, bytes]]) -> Envelopes:
    """Decode every record's Body as a CloudEvent; keep each `id` once; count what does not validate."""
    out = Envelopes()
    seen = set()
    for _name, data in files:
        out.files += 1
        for record in records_in(data):
            out.records += 1
            try:
                envelope = json.loads(record["Body"] or b"")
            except (ValueError, UnicodeDecodeError):
                out.unreadable += 1
                continue
            if not isinstance(envelope, dict) or schemas.errors(ENVELOPE_SCHEMA, envelope):
                out.invalid += 1
                continue
            if envelope["id"] in seen:
                out.duplicates += 1
                continue
            seen.add(envelope["id"])
            out.items.append(envelope)
            if record.get("EnqueuedTimeUtc"):
                out.enqueued[envelope["id"]] = str(record["EnqueuedTimeUtc"])
    return out
