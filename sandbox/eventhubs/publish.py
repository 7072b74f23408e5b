"""Turning what a producer sent into stored events: unpack batches, pick the partition, stamp annotations."""

from __future__ import annotations

from typing import List, Optional, Tuple

from .codec import (
    BATCH_FORMAT,
    SEC_DATA,
    SEC_DELIVERY_ANNOTATIONS,
    SEC_HEADER,
    SEC_MESSAGE_ANNOTATIONS,
    AMQPTypes,
    encode_annotations_section,
    section_value,
    split_sections,
    typed,
)
from .store import Event, Hub, Partition

PARTITION_KEY = b"x-opt-partition-key"


def _annotations(message: bytes) -> dict:
    for code, raw in split_sections(message):
        if code == SEC_MESSAGE_ANNOTATIONS:
            value = section_value(raw)
            return value if isinstance(value, dict) else {}
    return {}


def _key(message: bytes) -> Optional[str]:
    key = _annotations(message).get(PARTITION_KEY)
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8")
    return None if key is None else str(key)


def unpack(payload: bytes, message_format: Optional[int]) -> Tuple[List[bytes], Optional[str]]:
    """The messages in one delivery and the partition key that routes them (a batch goes to one partition)."""
    if message_format == BATCH_FORMAT:
        messages = [bytes(section_value(raw)) for code, raw in split_sections(payload) if code == SEC_DATA]
        key = _key(payload)
        if key is None and messages:
            key = _key(messages[0])
        return messages, key
    return [payload], _key(payload)


def stamp(message: bytes, sequence: int, enqueued_ms: int, key: Optional[str]) -> bytes:
    """The message as consumers get it: the broker's annotations set, delivery annotations dropped."""
    sections = split_sections(message)
    annotations = {}
    for code, raw in sections:
        if code == SEC_MESSAGE_ANNOTATIONS:
            value = section_value(raw)
            if isinstance(value, dict):
                annotations.update(value)
    annotations[b"x-opt-sequence-number"] = typed(AMQPTypes.long, sequence)
    annotations[b"x-opt-offset"] = typed(AMQPTypes.string, str(sequence))
    annotations[b"x-opt-enqueued-time"] = typed(AMQPTypes.timestamp, enqueued_ms)
    if key is not None:
        annotations[PARTITION_KEY] = typed(AMQPTypes.string, key)
    else:
        annotations.pop(PARTITION_KEY, None)
    header = [raw for code, raw in sections if code == SEC_HEADER]
    rest = [raw for code, raw in sections
            if code not in (SEC_HEADER, SEC_DELIVERY_ANNOTATIONS, SEC_MESSAGE_ANNOTATIONS)]
    return b"".join([*header, encode_annotations_section(annotations), *rest])


def publish(hub: Hub, partition: Optional[Partition], payload: bytes,
            message_format: Optional[int]) -> List[Event]:
    messages, key = unpack(payload, message_format)
    if not messages:
        return []
    target = partition or hub.pick(key)
    return target.append(messages, [key] * len(messages), stamp)
