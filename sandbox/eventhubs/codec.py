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
    "Properties", "Rejected", "Source", "Target", "decode_payload", "perf", "typed_entries",
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


# Bytes a value of an unknown constructor occupies, by the constructor's high nibble (AMQP 1.0, 1.2):
# fixed widths; for variable, compound and array ones the width of their size field.
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_SIZE_WIDTH = {0xA: 1, 0xC: 1, 0xE: 1, 0xB: 4, 0xD: 4, 0xF: 4}


def _typed_value(view: memoryview) -> Tuple[memoryview, Tuple[int, Any]]:
    """One encoded value and its constructor code. A constructor the SDK's decoder lacks (char,
    decimal32/64) comes back as its raw bytes rather than failing the whole map."""
    code = view[0]
    decode = _DECODE_BY_CONSTRUCTOR[code]
    if decode is not None:
        rest, value = decode(view[1:])
        return rest, (code, value)
    if code >> 4 in _FIXED_WIDTH:
        width = _FIXED_WIDTH[code >> 4]
        return view[1 + width:], (code, bytes(view[1:1 + width]))
    if code >> 4 in _SIZE_WIDTH:
        width = _SIZE_WIDTH[code >> 4]
        size = int.from_bytes(bytes(view[1:1 + width]), "big")
        return view[1 + width + size:], (code, bytes(view[1 + width:1 + width + size]))
    raise ValueError(f"AMQP constructor 0x{code:02x} cannot be read")


def typed_entries(section: bytes) -> List[Tuple[Tuple[int, Any], Tuple[int, Any]]]:
    """A map section's (application properties) entries, each key and value with its AMQP constructor
    code. The SDK's decoder returns string, symbol and binary alike as bytes and a timestamp as an int;
    the code tells them apart (0xa1/0xb1 string, 0xa3/0xb3 symbol, 0xa0/0xb0 binary, 0x83 timestamp)."""
    view = memoryview(section)[3:]  # after the descriptor 0x00 0x53 <code>
    code = view[0]
    if code == 0x40:  # null: no entries
        return []
    if code == 0xC1:
        count, view = view[2], view[3:]
    elif code == 0xD1:
        count, view = struct.unpack(">I", view[5:9])[0], view[9:]
    else:
        raise ValueError(f"section is not a map (constructor 0x{code:02x})")
    entries = []
    for _ in range(count // 2):
        view, key = _typed_value(view)
        view, value = _typed_value(view)
        entries.append((key, value))
    return entries


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
