"""AMQP 1.0 framing and type encoding, delegated to the codec that ships inside azure-eventhub.

We use `azure.eventhub._pyamqp` (pinned azure-eventhub 5.15.1) rather than our own codec: it encodes every
performative with its full field list, which is what the SDK's positional decoder expects on the other end.
It is a private module, so everything we take from it is imported here and nowhere else.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from azure.eventhub._pyamqp import performatives as perf
from azure.eventhub._pyamqp._decode import _DECODE_BY_CONSTRUCTOR, decode_frame, decode_payload
from azure.eventhub._pyamqp._encode import encode_frame, encode_payload, encode_value
from azure.eventhub._pyamqp.constants import HEADER_FRAME, SASL_HEADER_FRAME
from azure.eventhub._pyamqp.endpoints import Source, Target
from azure.eventhub._pyamqp.error import AMQPError
from azure.eventhub._pyamqp.message import Message, Properties
from azure.eventhub._pyamqp.outcomes import Accepted, Rejected
from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes

__all__ = [
    "AMQP_HEADER", "BATCH_FORMAT", "SASL_HEADER", "AMQPError", "AMQPTypes", "Accepted", "Message",
    "Properties", "Rejected", "Source", "Target", "decode_payload", "perf",
]

AMQP_HEADER = HEADER_FRAME
SASL_HEADER = SASL_HEADER_FRAME
BATCH_FORMAT = 0x80013700  # Microsoft's batch format: each data section is one whole encoded message
FRAME_AMQP = b"\x00"
FRAME_SASL = b"\x01"

# Section descriptors of an AMQP message (spec part 3.2).
SEC_HEADER = 0x70
SEC_DELIVERY_ANNOTATIONS = 0x71
SEC_MESSAGE_ANNOTATIONS = 0x72
SEC_DATA = 0x75


class Frame(NamedTuple):
    channel: int
    code: int  # performative descriptor, e.g. 0x10 open; -1 for an empty (heartbeat) frame
    fields: List[Any]  # positional fields; for a transfer the last item is the payload


def encode(channel: int, performative: Optional[NamedTuple], sasl: bool = False) -> bytes:
    """One whole frame, ready to write."""
    header, body = encode_frame(performative, frame_type=FRAME_SASL if sasl else FRAME_AMQP)
    if body is None:
        return header + struct.pack(">H", channel)
    return header + struct.pack(">H", channel) + bytes(body)


def parse(header: bytes, body: bytes) -> Frame:
    """Decode one frame from its 8-byte header and the rest."""
    doff = header[4]
    channel = struct.unpack(">H", header[6:8])[0]
    body = body[doff * 4 - 8:]
    if not body:
        return Frame(channel, -1, [])
    code, fields = decode_frame(memoryview(body))
    if code == 0x14:  # transfer: the payload comes back as a memoryview of the rest
        fields[-1] = bytes(fields[-1])
    return Frame(channel, code, fields)


def split_sections(payload: bytes) -> List[Tuple[int, bytes]]:
    """Split an encoded message into (descriptor, raw section bytes), keeping each section's exact bytes."""
    view = memoryview(payload)
    out: List[Tuple[int, bytes]] = []
    while view:
        if view[0] != 0x00 or view[1] != 0x53:
            raise ValueError("message section without a small-ulong descriptor")
        rest, _ = _DECODE_BY_CONSTRUCTOR[view[3]](view[4:])
        used = len(view) - len(rest)
        out.append((view[2], bytes(view[:used])))
        view = rest
    return out


def section_value(section: bytes) -> Any:
    _, value = _DECODE_BY_CONSTRUCTOR[section[3]](memoryview(section)[4:])
    return value


def encode_annotations_section(annotations: Dict[bytes, Any]) -> bytes:
    """A message-annotations section; values may be typed ({TYPE, VALUE}) or plain Python values."""
    items = []
    for key, value in annotations.items():
        typed = value if isinstance(value, dict) and TYPE in value else {TYPE: None, VALUE: value}
        items.append(({TYPE: AMQPTypes.symbol, VALUE: key}, typed))
    out = bytearray()
    encode_value(out, {TYPE: AMQPTypes.described, VALUE: (
        {TYPE: AMQPTypes.ulong, VALUE: SEC_MESSAGE_ANNOTATIONS}, {TYPE: AMQPTypes.map, VALUE: items})})
    return bytes(out)


def typed(amqp_type: str, value: Any) -> Dict[str, Any]:
    return {TYPE: amqp_type, VALUE: value}


def encode_message(message: Message) -> bytes:
    return bytes(encode_payload(bytearray(), message))
