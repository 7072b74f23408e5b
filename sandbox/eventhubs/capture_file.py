"""The Avro file Event Hubs Capture writes: its header, one record per event, the property types.

What Azure writes, and where we know it from (docs/eventhubs-server.md#capture-format has the sources):
- the header's schema is the compact JSON text below, byte for byte: record `EventData` in namespace
  `Microsoft.ServiceBus.Messaging`, `Properties` a map of ["long","double","string","bytes","null"],
  `SystemProperties` the same without "null". The headers of files Azure wrote, printed by public
  readers, show this text; Microsoft's "Exploring captured Avro files" page still shows an older
  schema without the "null";
- the header's metadata holds `avro.codec` ("null") first, then `avro.schema`;
- `EnqueuedTimeUtc` is .NET's default text of a UTC DateTime, `8/31/2017 7:12:14 PM` (Microsoft's
  example);
- property values keep their AMQP type where the union has one (string, binary as bytes, integers as
  long, float and double as double, null). Boolean, timestamp and uuid have no branch: no public file
  shows what Azure writes for them, so we write what the service's .NET writer most likely does, the
  value's default .NET text ("True"/"False", the timestamp like EnqueuedTimeUtc, the uuid's "D" form).

fastavro (pinned) encodes the records. It writes a schema as its own `json.dumps` text, so the header
is written here from the Avro container spec's header record and fastavro appends the blocks to it.
"""

from __future__ import annotations

import io
import json
import os
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Dict, Iterable, Optional

import fastavro

from .codec import SEC_DATA, section_value, split_sections, typed_entries
from .store import Event

SEC_APPLICATION_PROPERTIES = 0x74
SEC_AMQP_VALUE = 0x77

# Azure's writer schema as text, exactly as it appears in the header of the files Azure writes.
CAPTURE_SCHEMA_TEXT = (
    '{"type":"record","name":"EventData","namespace":"Microsoft.ServiceBus.Messaging","fields":['
    '{"name":"SequenceNumber","type":"long"},'
    '{"name":"Offset","type":"string"},'
    '{"name":"EnqueuedTimeUtc","type":"string"},'
    '{"name":"SystemProperties","type":{"type":"map","values":["long","double","string","bytes"]}},'
    '{"name":"Properties","type":{"type":"map","values":["long","double","string","bytes","null"]}},'
    '{"name":"Body","type":["null","bytes"]}]}'
)
CAPTURE_SCHEMA: Dict[str, Any] = json.loads(CAPTURE_SCHEMA_TEXT)

# The object container file's header record (Avro specification, "Object Container Files").
_HEADER_SCHEMA = {
    "type": "record", "name": "org.apache.avro.file.Header",
    "fields": [
        {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 4}},
        {"name": "meta", "type": {"type": "map", "values": "bytes"}},
        {"name": "sync", "type": {"type": "fixed", "name": "Sync", "size": 16}},
    ],
}
_MAGIC = b"Obj\x01"

# AMQP constructor codes (AMQP 1.0 part 1) of the simple types an application property can hold.
_NULL = {0x40}
_BOOLEAN = {0x41, 0x42, 0x56}
_INTEGER = {0x43, 0x44, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x60, 0x61, 0x70, 0x71, 0x80, 0x81}
_FLOATING = {0x72, 0x82}
_TEXT = {0xA1, 0xB1, 0xA3, 0xB3}  # string, symbol
_BINARY = {0xA0, 0xB0}
_CHAR = 0x73
_TIMESTAMP = 0x83
_UUID = 0x98
_LONG_MAX = 2**63 - 1


def enqueued_time_text(enqueued_ms: int) -> str:
    """A UTC time as .NET's default DateTime text (en-US), as EnqueuedTimeUtc: `8/31/2017 7:12:14 PM`."""
    at = datetime.fromtimestamp(enqueued_ms / 1000, tz=timezone.utc)
    hour12 = at.hour % 12 or 12
    half = "PM" if at.hour >= 12 else "AM"
    return f"{at.month}/{at.day}/{at.year} {hour12}:{at.minute:02d}:{at.second:02d} {half}"


def property_value(code: int, value: Any) -> Any:
    """One application property value (AMQP constructor `code`, decoded `value`) as Capture writes it
    into the ["long","double","string","bytes","null"] union: the AMQP type decides, not the content."""
    if code in _NULL:
        return None
    if code in _BINARY:
        return bytes(value)
    if code in _TEXT:
        return bytes(value).decode("utf-8", "replace")
    if code in _INTEGER:
        return int(value) if int(value) <= _LONG_MAX else str(value)  # a ulong past long: its text
    if code in _FLOATING:
        return float(value)
    if code in _BOOLEAN:
        return "True" if value else "False"  # .NET Boolean.ToString()
    if code == _TIMESTAMP:
        return enqueued_time_text(int(value))  # .NET DateTime.ToString(), UTC
    if code == _UUID:
        return str(value)  # .NET Guid.ToString(): lowercase "D" form, as Python's
    if code == _CHAR:
        return chr(int.from_bytes(value, "big"))  # UTF-32 code point
    if isinstance(value, Decimal):
        return str(value)
    return value if isinstance(value, bytes) else str(value)


def capture_record(event: Event) -> Dict[str, Any]:
    """One stored event as the Avro record Capture writes for it."""
    properties: Dict[str, Any] = {}
    body = bytearray()
    has_body = False
    for code, raw in split_sections(event.message):
        if code == SEC_APPLICATION_PROPERTIES:
            for (_, key), (value_code, value) in typed_entries(raw):
                name = key.decode("utf-8", "replace") if isinstance(key, (bytes, bytearray)) else str(key)
                properties[name] = property_value(value_code, value)
        elif code == SEC_DATA:
            body += bytes(section_value(raw))
            has_body = True
        elif code == SEC_AMQP_VALUE:
            value = section_value(raw)
            body += bytes(value) if isinstance(value, (bytes, bytearray)) else str(value).encode("utf-8")
            has_body = True
        # message annotations: the broker's own are the record's top-level fields
    system: Dict[str, Any] = {}
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


def avro_file(events: Iterable[Event], sync_marker: Optional[bytes] = None) -> bytes:
    """An Avro object container file of these events (header only when there are none)."""
    out = io.BytesIO()
    meta = {"avro.codec": b"null", "avro.schema": CAPTURE_SCHEMA_TEXT.encode("utf-8")}
    fastavro.schemaless_writer(
        out, _HEADER_SCHEMA, {"magic": _MAGIC, "meta": meta, "sync": sync_marker or os.urandom(16)})
    # The stream is readable and not empty: fastavro appends blocks under the header written above.
    fastavro.writer(out, CAPTURE_SCHEMA, (capture_record(e) for e in events), codec="null")
    return out.getvalue()
