"""The two request/response nodes: `$cbs` (put-token; every token is accepted) and `$management` (READ)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .codec import AMQPTypes, Message, Properties, typed
from .store import Broker

HUB_TYPE = b"com.microsoft:eventhub"
PARTITION_TYPE = b"com.microsoft:partition"


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    return str(value)


def _reply(request: Message, status: int, description: str, value: Any = None) -> Message:
    props = request.properties
    correlation = None
    if props is not None:
        correlation = props.message_id if props.message_id is not None else props.correlation_id
    # Both spellings of the status fields: the SDK reads the dashed ones, other AMQP clients the camel case.
    app = {"status-code": status, "status-description": description,
           "statusCode": status, "statusDescription": description}
    return Message(properties=Properties(correlation_id=correlation), application_properties=app, value=value)


def cbs(request: Message) -> Message:
    app = request.application_properties or {}
    operation = _text(app.get(b"operation"))
    if operation != "put-token":
        return _reply(request, 400, f"unsupported $cbs operation {operation!r}; only put-token is served")
    # The sandbox does no authorization: the SDK must still hand over a token, which is all we check.
    return _reply(request, 202, "Accepted")


def management(request: Message, broker: Broker) -> Message:
    app = request.application_properties or {}
    operation = _text(app.get(b"operation"))
    kind = app.get(b"type")
    name = _text(app.get(b"name")) or ""
    if operation != "READ":
        return _reply(request, 400, f"unsupported $management operation {operation!r}; only READ is served")
    hub = broker.hub(name)
    if hub is None:
        return _reply(request, 404, f"The messaging entity '{name}' could not be found "
                                    f"(hubs here: {', '.join(sorted(broker.hubs)) or 'none'}).")
    if kind == HUB_TYPE:
        return _reply(request, 200, "OK", {
            "name": hub.name,
            "created_at": typed(AMQPTypes.timestamp, hub.created_ms),
            "partition_count": len(hub.partitions),
            "partition_ids": typed(AMQPTypes.array, [typed(AMQPTypes.string, p) for p in hub.partition_ids]),
            "type": "com.microsoft:eventhub",
        })
    if kind == PARTITION_TYPE:
        pid = _text(app.get(b"partition")) or ""
        partition = hub.partition(pid)
        if partition is None:
            return _reply(request, 404, f"Partition '{pid}' does not exist in hub '{hub.name}' "
                                        f"(partitions 0..{len(hub.partitions) - 1}).")
        last = partition.last
        info: Dict[str, Any] = {
            "name": hub.name,
            "partition": partition.id,
            "begin_sequence_number": typed(AMQPTypes.long, partition.begin_sequence),
            "last_enqueued_sequence_number": typed(AMQPTypes.long, last.sequence_number if last else -1),
            "last_enqueued_offset": last.offset if last else "-1",
            "last_enqueued_time_utc": typed(AMQPTypes.timestamp, last.enqueued_ms if last else 0),
            "is_partition_empty": last is None,
            "type": "com.microsoft:partition",
        }
        return _reply(request, 200, "OK", info)
    return _reply(request, 400, f"unsupported $management type {_text(kind)!r}")
