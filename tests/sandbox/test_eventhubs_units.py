"""The server's parts on their own: store, filters, addresses, CLI; link rules over a raw socket."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

from sandbox import processes
from sandbox.eventhubs import codec
from sandbox.eventhubs.addresses import parse_address
from sandbox.eventhubs.filters import FilterError, parse_filters
from sandbox.eventhubs.publish import stamp, unpack
from sandbox.eventhubs.store import Broker, Partition

SEL = b"apache.org:selector-filter:string"


def _message(body: bytes, key: str = "") -> bytes:
    annotations = {b"x-opt-partition-key": key} if key else None
    return codec.encode_message(codec.Message(message_annotations=annotations, data=[body]))


def _fill(partition: Partition, n: int) -> None:
    partition.append([_message(f"m{i}".encode()) for i in range(n)], [None] * n, stamp)


def test_store_evicts_oldest_beyond_max_events() -> None:
    p = Partition("h", "0", max_events=3, path=None)
    _fill(p, 5)
    assert [e.sequence_number for e in p.events] == [2, 3, 4] and p.begin_sequence == 2
    assert [e.sequence_number for e in p.read(0, 10)] == [2, 3, 4]  # an evicted position starts at the oldest


def test_store_persists_and_drops_a_torn_last_record(tmp_path: Path) -> None:
    broker = Broker()
    hub = broker.add_hub("h", 1, data_dir=tmp_path)
    _fill(hub.partitions[0], 3)
    broker.close()
    log = tmp_path / "h" / "partition-0.log"
    with open(log, "ab") as f:
        f.write(b"\x00\x00\x01\x00partial")  # a crash mid-write
    again = Broker().add_hub("h", 1, data_dir=tmp_path)
    p = again.partitions[0]
    assert [e.sequence_number for e in p.events] == [0, 1, 2] and p.next_sequence == 3
    assert again.created_ms == hub.created_ms
    decoded = codec.decode_payload(memoryview(p.events[1].message))
    assert decoded.data == [b"m1"] and decoded.message_annotations[b"x-opt-sequence-number"] == 1
    assert decoded.message_annotations[b"x-opt-offset"] == b"1"


def test_filters() -> None:
    p = Partition("h", "0", max_events=10, path=None)
    _fill(p, 4)
    assert parse_filters(None).first_sequence(p) == 0
    assert parse_filters({SEL: b"amqp.annotation.x-opt-offset > '-1'"}).first_sequence(p) == 0
    assert parse_filters({SEL: b"amqp.annotation.x-opt-offset > '@latest'"}).first_sequence(p) == 4
    assert parse_filters({SEL: b"amqp.annotation.x-opt-offset > '1'"}).first_sequence(p) == 2
    assert parse_filters({SEL: b"amqp.annotation.x-opt-sequence-number >= '1'"}).first_sequence(p) == 1
    since = f"amqp.annotation.x-opt-enqueued-time > '{p.events[0].enqueued_ms - 1}'".encode()
    assert parse_filters({SEL: since}).first_sequence(p) == 0
    with pytest.raises(FilterError, match="unsupported selector"):
        parse_filters({SEL: b"sys.foo = 1"})


def test_batches_unpack_to_their_messages_and_key() -> None:
    inner = [_message(b"a", "vm-1"), _message(b"b", "vm-1")]
    outer = codec.Message(message_annotations={b"x-opt-partition-key": "vm-1"}, data=inner)
    batch = codec.encode_message(outer)
    messages, key = unpack(batch, codec.BATCH_FORMAT)
    assert messages == inner and key == "vm-1"
    stamped = codec.decode_payload(memoryview(stamp(messages[0], 7, 1000, key)))
    assert stamped.message_annotations[b"x-opt-partition-key"] == b"vm-1"
    assert stamped.message_annotations[b"x-opt-enqueued-time"] == 1000


def test_addresses() -> None:
    assert parse_address("amqps://127.0.0.1:5672/hub").kind == "hub"
    assert parse_address("amqps://h:1/hub/Partitions/3").partition == "3"
    consumer = parse_address("amqps://h:1/hub/ConsumerGroups/$Default/Partitions/0")
    assert (consumer.kind, consumer.consumer_group, consumer.partition) == ("consumer", "$Default", "0")
    assert parse_address("$cbs").kind == "cbs" and parse_address("hub/x").kind == "unknown"


def test_cli_rejects_a_bad_hub_spec() -> None:
    result = subprocess.run([sys.executable, "-m", "sandbox.eventhubs", "--port", "1", "--hub", "oops"],
                            capture_output=True, text=True, timeout=30, cwd=processes.REPO)
    assert result.returncode == 2 and "expected NAME=PARTITIONS" in result.stderr


# ---- the link rules over a raw socket, with the same codec the SDK uses --------------------------------

class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(codec.AMQP_HEADER)
        assert self._exact(8) == codec.AMQP_HEADER

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("server closed the connection")
            data += chunk
        return data

    def send(self, performative: object) -> None:
        self.sock.sendall(codec.encode(0, performative))  # type: ignore[arg-type]

    def frame(self) -> codec.Frame:
        header = self._exact(8)
        return codec.parse(header, self._exact(struct.unpack(">I", header[:4])[0] - 8))

    def until(self, code: int) -> List[codec.Frame]:
        frames: List[codec.Frame] = []
        for _ in range(1000):
            frames.append(self.frame())
            if frames[-1].code == code:
                return frames
        raise AssertionError(f"no frame 0x{code:02x}")


@pytest.fixture
def raw(tmp_path: Path) -> Iterator[RawClient]:
    server = processes.start_eventhubs(["raw=1"], log_dir=tmp_path)
    client = RawClient(server.port)
    client.send(codec.perf.OpenFrame("raw-test", None, 65536, 8, None, None, None, None, None, None))
    client.until(0x10)
    client.send(codec.perf.BeginFrame(None, 0, 1000, 1000, 16, None, None, None))
    client.until(0x11)
    yield client
    client.sock.close()
    server.stop()


def _attach(name: str, handle: int, receiver: bool, address: str) -> object:
    source = codec.Source(address=address if receiver else name,
                          filters={SEL: (SEL, b"amqp.annotation.x-opt-offset > '-1'")} if receiver else None)
    return codec.perf.AttachFrame(name, handle, receiver, None, None, source,
                                  codec.Target(address=name if receiver else address),
                                  None, None, None if receiver else 0, None, None, None, None)


def test_sends_are_settled_and_link_credit_is_respected(raw: RawClient) -> None:
    raw.send(_attach("s", 0, False, "raw/Partitions/0"))
    assert raw.until(0x13)[-1].fields[6] > 0  # the server grants credit to a sender
    for i in range(5):
        raw.send(codec.perf.TransferFrame(handle=0, delivery_id=i, delivery_tag=bytes([i]), message_format=0,
                                          settled=False, more=False, payload=_message(f"r{i}".encode())))
        disposition = raw.until(0x15)[-1].fields
        assert disposition[1] == i and disposition[3] is True and "accepted" in disposition[4]
    raw.send(_attach("r", 1, True, "raw/ConsumerGroups/$Default/Partitions/0"))
    raw.until(0x12)
    raw.send(codec.perf.FlowFrame(0, 1000, 5, 1000, 1, 0, 2, None, None, False, None))  # credit 2
    first = [f for f in raw.until(0x14) + raw.until(0x14) if f.code == 0x14]
    # Echo asks for the server's link state; all it sends before that answer must fit the credit.
    raw.send(codec.perf.FlowFrame(0, 1000, 5, 1000, 1, 0, 2, None, None, True, None))
    before_echo = raw.until(0x13)
    assert [f.code for f in before_echo].count(0x14) == 0 and before_echo[-1].fields[6] == 0
    raw.send(codec.perf.FlowFrame(0, 1000, 5, 1000, 1, 2, 10, None, None, False, None))  # 10 more
    rest = [f for _ in range(3) for f in raw.until(0x14)]
    bodies = [codec.decode_payload(memoryview(f.fields[-1])).data[0] for f in first + rest if f.code == 0x14]
    assert bodies == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    # Drain with nothing left: the server uses the credit up and says so (delivery count 5 + 7 = 12).
    raw.send(codec.perf.FlowFrame(0, 1000, 5, 1000, 1, 5, 7, None, True, False, None))
    drained = raw.until(0x13)[-1].fields
    assert (drained[5], drained[6]) == (12, 0)


def test_an_oversize_message_is_rejected_and_the_link_stays_up(raw: RawClient) -> None:
    raw.send(_attach("s", 0, False, "raw/Partitions/0"))
    raw.until(0x13)
    chunk = b"z" * 60_000
    for i in range(18):  # ~1.08 MB in one delivery, over the 1 MB limit
        raw.send(codec.perf.TransferFrame(handle=0, delivery_id=0 if i == 0 else None,
                                          delivery_tag=b"\x00" if i == 0 else None, message_format=0,
                                          settled=False, more=i < 17, payload=chunk))
    state = raw.until(0x15)[-1].fields[4]
    assert "rejected" in state and b"message-size-exceeded" in str(state).encode()
    raw.send(codec.perf.TransferFrame(handle=0, delivery_id=1, delivery_tag=b"\x01", message_format=0,
                                      settled=False, more=False, payload=_message(b"fine")))
    assert "accepted" in raw.until(0x15)[-1].fields[4]


def test_heartbeats_when_the_client_sets_an_idle_timeout(tmp_path: Path) -> None:
    server = processes.start_eventhubs(["raw=1"], log_dir=tmp_path)
    try:
        client = RawClient(server.port)
        client.send(codec.perf.OpenFrame("raw-test", None, 65536, 8, 200, None, None, None, None, None))
        assert client.frame().code == 0x10
        assert client.frame().code == -1  # an empty frame, well within the 10 s socket timeout
        client.send(codec.perf.CloseFrame(error=None))
        assert client.until(0x18)[-1].fields[0] is None  # a clean close
        client.sock.close()
    finally:
        server.stop()
