"""Capture in the sandbox Event Hubs server: Capture-format Avro files in Azurite, read back with the
Apache `avro` reader (not fastavro, the writer's library, so the reading shares none of its assumptions).

Real parts only: the server process, the azure-eventhub producer over AMQP, Azurite, the blob SDK.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from avro.datafile import DataFileReader
from avro.io import DatumReader
from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport  # how the SDK encodes a message
from azure.storage.blob import BlobServiceClient, ContainerClient

from sandbox import processes
from sandbox.eventhubs import capture
from sandbox.eventhubs.codec import AMQPTypes, encode_message, typed
from sandbox.eventhubs.publish import stamp
from sandbox.eventhubs.store import Event

# The header schema of files Azure Capture writes, as public readers print it (docs/eventhubs-server.md
# cites them): compact JSON, "null" in Properties' union only, the namespace as its own key.
AZURE_SCHEMA_TEXT = (
    '{"type":"record","name":"EventData","namespace":"Microsoft.ServiceBus.Messaging","fields":['
    '{"name":"SequenceNumber","type":"long"},{"name":"Offset","type":"string"},'
    '{"name":"EnqueuedTimeUtc","type":"string"},'
    '{"name":"SystemProperties","type":{"type":"map","values":["long","double","string","bytes"]}},'
    '{"name":"Properties","type":{"type":"map","values":["long","double","string","bytes","null"]}},'
    '{"name":"Body","type":["null","bytes"]}]}'
)

NAME = re.compile(r"^sandbox/(?P<hub>[^/]+)/(?P<partition>\d+)/"
                  r"(\d{4})/(\d{2})/(\d{2})/(\d{2})/(\d{2})/(\d{2})\.avro$")


def read_avro(data: bytes) -> Tuple[Dict[str, bytes], List[Dict[str, Any]]]:
    """An object container file's header metadata (in file order) and records, by the Apache reader."""
    reader = DataFileReader(io.BytesIO(data), DatumReader())
    try:
        return dict(reader.meta), list(reader)
    finally:
        reader.close()


# ---- units: names, time text, records ----------------------------------------------------------

def test_blob_name_is_the_documented_format_zero_padded_utc() -> None:
    at = datetime(2017, 12, 8, 3, 3, 17, tzinfo=timezone.utc)
    assert capture.blob_name(capture.DEFAULT_NAME_FORMAT, "mynamespace", "myeventhub", "0", at) == \
        "mynamespace/myeventhub/0/2017/12/08/03/03/17.avro"
    local = datetime(2017, 12, 8, 4, 3, 17, tzinfo=timezone(timedelta(hours=1)))
    name = capture.blob_name(capture.DEFAULT_NAME_FORMAT, "n", "h", "3", local)
    assert name.endswith("/2017/12/08/03/03/17.avro")


def test_enqueued_time_text_is_dotnet_invariant_utc() -> None:
    def ms(*args: int) -> int:
        return int(datetime(*args, tzinfo=timezone.utc).timestamp() * 1000)

    assert capture.enqueued_time_text(ms(2017, 8, 31, 19, 12, 14)) == "8/31/2017 7:12:14 PM"
    assert capture.enqueued_time_text(ms(2016, 11, 16, 0, 4, 1)) == "11/16/2016 12:04:01 AM"
    assert capture.enqueued_time_text(ms(2020, 1, 2, 12, 0, 0)) == "1/2/2020 12:00:00 PM"


@pytest.mark.parametrize("fmt, problem", [
    ("{Namespace}/{EventHub}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}", "missing {PartitionId}"),
    (capture.DEFAULT_NAME_FORMAT + "/{Bogus}", "cannot be filled in"),
])
def test_name_format_must_hold_every_field(fmt: str, problem: str) -> None:
    assert problem in (capture.check_name_format(fmt) or "")


def test_reordered_name_format_is_accepted() -> None:
    fmt = "{Year}/{Month}/{Day}/{Namespace}/{EventHub}/{PartitionId}/{Hour}/{Minute}/{Second}"
    assert capture.check_name_format(fmt) is None


def test_record_carries_body_properties_and_partition_key() -> None:
    event = EventData(b'{"id":"x"}')
    event.properties = {"kind": "heartbeat", "n": 7}
    message = encode_message(PyamqpTransport.to_outgoing_amqp_message(event.raw_amqp_message))
    stored = Event(41, 1_500_000_000_123, "vm-key", stamp(message, 41, 1_500_000_000_123, "vm-key"))
    record = capture.capture_record(stored)
    assert record == {
        "SequenceNumber": 41,
        "Offset": "41",
        "EnqueuedTimeUtc": "7/14/2017 2:40:00 AM",
        "SystemProperties": {"x-opt-partition-key": "vm-key"},
        "Properties": {"kind": "heartbeat", "n": 7},
        "Body": b'{"id":"x"}',
    }
    _, parsed = read_avro(capture.avro_file([stored]))
    assert parsed == [record]


def test_header_holds_azures_schema_text_and_codec_in_azures_order() -> None:
    meta, records = read_avro(capture.avro_file([]))
    assert records == []  # an empty window: a header-only file
    assert list(meta) == ["avro.codec", "avro.schema"]
    assert meta["avro.codec"] == b"null"
    assert meta["avro.schema"].decode("utf-8") == AZURE_SCHEMA_TEXT


def _stored(properties: Dict[str, Any]) -> Event:
    event = EventData(b"body")
    event.properties = properties
    message = encode_message(PyamqpTransport.to_outgoing_amqp_message(event.raw_amqp_message))
    return Event(0, 1_500_000_000_000, None, stamp(message, 0, 1_500_000_000_000, None))


@pytest.mark.parametrize("value, expected", [
    (typed(AMQPTypes.symbol, b"sym"), "sym"),
    (typed(AMQPTypes.ubyte, 200), 200),
    (typed(AMQPTypes.short, -3), -3),
    (typed(AMQPTypes.uint, 2**32 - 1), 2**32 - 1),
    (typed(AMQPTypes.ulong, 2**64 - 1), str(2**64 - 1)),  # past a long: its text
    (typed(AMQPTypes.float, 0.5), 0.5),
    (typed(AMQPTypes.binary, b"plain text"), b"plain text"),
])
def test_property_types_the_python_sdk_can_only_send_typed(value: Any, expected: Any) -> None:
    _, (record,) = read_avro(capture.avro_file([_stored({"p": value})]))
    assert record["Properties"] == {"p": expected}
    assert type(record["Properties"]["p"]) is type(expected)


# ---- CLI ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, expected", [
    (["--capture-connection-string", "not a connection string"], "--capture-connection-string"),
    (["--capture-connection-string", "UseDevelopmentStorage=true", "--capture-interval", "0.5"],
     "--capture-interval must be >= 1"),
    (["--capture-connection-string", "UseDevelopmentStorage=true", "--capture-name-format", "{Namespace}/x"],
     "missing {EventHub}"),
])
def test_capture_misconfiguration_is_one_line_and_exit_2(extra: List[str], expected: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "sandbox.eventhubs", "--port", "1", "--hub", "h=1", *extra],
                          cwd=processes.REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- the real thing: SDK -> server -> Azurite ------------------------------------------------------

def _container(azurite: processes.Server, name: str) -> ContainerClient:
    service = BlobServiceClient.from_connection_string(azurite.extra["connection_string"])
    return service.get_container_client(name)


def _capture_server(azurite: processes.Server, hub: str, container: str, log_dir: Path,
                    extra: Sequence[str] = (), data_dir: Optional[Path] = None,
                    port: Optional[int] = None) -> processes.Server:
    args = ["--capture-connection-string", azurite.extra["connection_string"],
            "--capture-container", container, *extra]
    if data_dir is not None:
        args += ["--data-dir", str(data_dir)]
    return processes.start_eventhubs([hub], log_dir=log_dir, args=args, port=port)


def _send(server: processes.Server, hub: str, bodies_by_key: Dict[str, List[bytes]]) -> None:
    conn = processes.eventhubs_connection_string(server.port, hub)
    with EventHubProducerClient.from_connection_string(conn, retry_total=1) as client:
        for key, bodies in bodies_by_key.items():
            batch = client.create_batch(partition_key=key)
            for body in bodies:
                event = EventData(body)
                event.properties = {"source": "test", "size": len(body)}
                batch.add(event)
            client.send_batch(batch)


def _files(container: ContainerClient) -> Dict[str, List[dict]]:
    out = {}
    for blob in container.list_blobs():
        out[blob.name] = read_avro(container.download_blob(blob.name).readall())[1]
    return out


def _wait_for_records(container: ContainerClient, count: int, timeout: float = 30.0,
                      empty_window: bool = False) -> Dict[str, List[dict]]:
    """The container's files once they hold `count` records (and, `empty_window`, once a window without
    events has its file too: on a busy machine that may come a window later than the records)."""
    deadline = time.monotonic() + timeout
    files: Dict[str, List[dict]] = {}
    while time.monotonic() < deadline:
        if container.exists():
            files = _files(container)
            if sum(len(r) for r in files.values()) >= count and (
                    not empty_window or any(not r for r in files.values())):
                return files
        time.sleep(0.5)
    written = sum(len(r) for r in files.values())
    empty = sum(1 for r in files.values() if not r)
    raise AssertionError(
        f"capture wrote {written} of {count} records, {empty} empty window file(s): {list(files)}")


def _enqueued(record: dict) -> datetime:
    return datetime.strptime(record["EnqueuedTimeUtc"], "%m/%d/%Y %I:%M:%S %p").replace(tzinfo=timezone.utc)


@pytest.fixture
def container_name() -> str:
    return f"capture-{uuid.uuid4().hex[:10]}"


def test_capture_writes_every_event_once_in_capture_format(
        azurite: processes.Server, container_name: str, tmp_path: Path) -> None:
    started = datetime.now(timezone.utc).replace(microsecond=0)
    server = _capture_server(azurite, "cap=2", container_name, tmp_path, ["--capture-interval", "1"])
    try:
        sent = {"vm-a": [json.dumps({"id": f"a{i}"}).encode() for i in range(5)],
                "vm-b": [json.dumps({"id": f"b{i}"}).encode() for i in range(3)]}
        _send(server, "cap", sent)
        files = _wait_for_records(_container(azurite, container_name), 8, empty_window=True)
    finally:
        server.stop()
    records = [r for name in sorted(files) for r in files[name]]
    # every event exactly once, each key's events in order, in one partition, with its own properties
    by_key: Dict[str, List[dict]] = {}
    for record in records:
        by_key.setdefault(record["SystemProperties"]["x-opt-partition-key"], []).append(record)
    assert {k: [r["Body"] for r in v] for k, v in by_key.items()} == sent
    for record in records:
        assert record["Properties"] == {"source": "test", "size": len(record["Body"])}
        assert record["Offset"] == str(record["SequenceNumber"])
        enqueued = _enqueued(record)
        assert started - timedelta(seconds=1) <= enqueued <= datetime.now(timezone.utc)
    # names: the documented path; each partition's windows; a file's name is at or before its events
    partitions_with_events = set()
    for name, recs in files.items():
        match = NAME.match(name)
        assert match and match.group("hub") == "cap", name
        window = datetime(*map(int, match.groups()[2:]), tzinfo=timezone.utc)
        assert window >= started - timedelta(seconds=1)
        for record in recs:
            assert _enqueued(record) >= window
        if recs:
            partitions_with_events.add(match.group("partition"))
    assert len(partitions_with_events) in (1, 2)
    # windows without events still get a (header-only) file, as Azure writes them
    assert any(not recs for recs in files.values())


# Every application property type the azure-eventhub producer can send, and what Capture writes for it
# (docs/eventhubs-server.md#capture-format: the union's own types kept; bool, timestamp and uuid as text).
TYPED_PROPERTIES: Dict[str, Tuple[Any, Any]] = {
    "string": ("héllo", "héllo"),
    "binary-utf8": (b"plain ascii", b"plain ascii"),  # AMQP binary stays bytes, even when it decodes
    "binary": (b"\xff\x00\xfe", b"\xff\x00\xfe"),
    "int": (-7, -7),
    "long": (typed(AMQPTypes.long, 2**40 + 3), 2**40 + 3),
    "double": (2.5, 2.5),
    "true": (True, "True"),
    "false": (False, "False"),
    "timestamp": (datetime(2024, 1, 2, 15, 4, 5, 678000, tzinfo=timezone.utc), "1/2/2024 3:04:05 PM"),
    "uuid": (uuid.UUID("12345678-9abc-def0-1234-56789abcdef0"), "12345678-9abc-def0-1234-56789abcdef0"),
    "null": (None, None),
}


def test_capture_keeps_each_property_type_as_azure_writes_it(
        azurite: processes.Server, container_name: str, tmp_path: Path) -> None:
    server = _capture_server(azurite, "typed=1", container_name, tmp_path,
                             ["--capture-interval", "1", "--capture-skip-empty"])
    try:
        conn = processes.eventhubs_connection_string(server.port, "typed")
        with EventHubProducerClient.from_connection_string(conn, retry_total=1) as client:
            event = EventData(b'{"id":"typed"}')
            event.properties = {name: sent for name, (sent, _) in TYPED_PROPERTIES.items()}
            client.send_event(event)
        _wait_for_records(_container(azurite, container_name), 1)
        container = _container(azurite, container_name)
        (blob,) = [b.name for b in container.list_blobs()]
        meta, (record,) = read_avro(container.download_blob(blob).readall())
    finally:
        server.stop()
    assert meta["avro.schema"].decode("utf-8") == AZURE_SCHEMA_TEXT
    assert record["Body"] == b'{"id":"typed"}'
    expected = {name: written for name, (_, written) in TYPED_PROPERTIES.items()}
    assert record["Properties"] == expected
    for name, written in expected.items():  # the union branch, not only an equal value (1 == 1.0)
        assert type(record["Properties"][name]) is type(written), name


def test_stop_flushes_the_open_window_and_skip_empty_writes_no_empty_files(
        azurite: processes.Server, container_name: str, tmp_path: Path) -> None:
    server = _capture_server(azurite, "flush=2", container_name, tmp_path,
                             ["--capture-interval", "300", "--capture-skip-empty"])
    try:
        _send(server, "flush", {"only-key": [b"one", b"two"]})
        time.sleep(1.0)
        container = _container(azurite, container_name)
        assert _files(container) == {}  # a 5-minute window is still open
    finally:
        server.stop()
    files = _files(container)
    assert len(files) == 1, files  # only the partition that got events; no empty file
    (records,) = files.values()
    assert [r["Body"] for r in records] == [b"one", b"two"]


def test_size_limit_closes_a_window_early(
        azurite: processes.Server, container_name: str, tmp_path: Path) -> None:
    server = _capture_server(azurite, "size=1", container_name, tmp_path,
                             ["--capture-interval", "300", "--capture-size-limit", "2000",
                              "--capture-skip-empty"])
    try:
        _send(server, "size", {"k": [b"x" * 1500, b"y" * 1500]})
        files = _wait_for_records(_container(azurite, container_name), 2, timeout=20)
    finally:
        server.kill()  # no flush on SIGKILL: whatever is there was written by the size trigger
    assert sum(len(r) for r in files.values()) == 2


def test_restart_with_data_dir_captures_nothing_twice(
        azurite: processes.Server, container_name: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = _capture_server(azurite, "again=1", container_name, tmp_path,
                             ["--capture-interval", "1", "--capture-skip-empty"], data_dir=data)
    try:
        _send(server, "again", {"k": [b"first", b"second"]})
        _wait_for_records(_container(azurite, container_name), 2)
    finally:
        server.stop()
    time.sleep(1.1)  # the next server's first window starts in a later second
    server = _capture_server(azurite, "again=1", container_name, tmp_path,
                             ["--capture-interval", "1", "--capture-skip-empty"], data_dir=data)
    try:
        _send(server, "again", {"k": [b"third"]})
        files = _wait_for_records(_container(azurite, container_name), 3)
        time.sleep(1.5)  # a window or two more: still nothing re-captured
        files = _files(_container(azurite, container_name))
    finally:
        server.stop()
    records = sorted((r for recs in files.values() for r in recs), key=lambda r: r["SequenceNumber"])
    assert [(r["SequenceNumber"], r["Body"]) for r in records] == \
        [(0, b"first"), (1, b"second"), (2, b"third")]


def test_capture_retries_while_storage_is_down(tmp_path: Path, container_name: str) -> None:
    """Storage down when the window closes: nothing is lost, the file appears once storage is back."""
    ports = {"blob": processes.free_port(), "queue": processes.free_port(), "table": processes.free_port()}
    conn = processes.azurite_connection_string(ports["blob"], ports["queue"], ports["table"])
    server = processes.start_eventhubs(
        ["down=1"], log_dir=tmp_path,
        args=["--capture-connection-string", conn, "--capture-container", container_name,
              "--capture-interval", "1", "--capture-skip-empty"])
    storage: Optional[processes.Server] = None
    try:
        _send(server, "down", {"k": [b"kept"]})
        time.sleep(2.5)  # windows close against a closed port
        storage = processes.start_azurite(log_dir=tmp_path, ports=ports)
        container = BlobServiceClient.from_connection_string(conn).get_container_client(container_name)
        files = _wait_for_records(container, 1)
    finally:
        server.stop()
        if storage is not None:
            storage.stop()
    assert [r["Body"] for recs in files.values() for r in recs] == [b"kept"]

