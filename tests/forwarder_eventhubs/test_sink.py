"""EventHubSink on its own: the real azure-eventhub producer against the sandbox server over AMQP,
read back with a real EventHubConsumerClient. Plus its configuration rules."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import schemas
from forwarder import config as cfg
from forwarder import sinks
from forwarder.sinks.base import SinkError
from forwarder.sinks.eventhub import (
    CONTENT_TYPE,
    MAX_STUCK,
    EventHubConfigError,
    EventHubSettings,
    EventHubSink,
)
from sandbox import processes

from .helpers import Consumer, wait_until

HUBS = ["split=4", "oversize=2", "keys=4", "sets=8"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    srv = processes.start_eventhubs(HUBS, log_dir=tmp_path_factory.mktemp("eventhubs"))
    yield srv
    srv.stop()


def sink_for(port: int, hub: str) -> EventHubSink:
    return EventHubSink(EventHubSettings(connection_string=processes.eventhubs_connection_string(port, hub)))


def sent_and_read(port: int, hub: str, envelopes: List[Dict[str, Any]]) -> Consumer:
    """Send `envelopes` through a sink, then read every one back with the SDK's consumer (closed after)."""
    sink = sink_for(port, hub)
    try:
        sink.send(envelopes)
    finally:
        sink.close()
    consumer = Consumer(processes.eventhubs_connection_string(port, hub)).start()
    try:
        wait_until(lambda: len(consumer.items()) >= len(envelopes), timeout=30,
                   what=f"{len(envelopes)} events")
    finally:
        consumer.close()
    return consumer


def envelope(vm: str, n: int, pad: int = 0, type_: str = "scheduledevents.incarnation.v1") -> Dict[str, Any]:
    return {"specversion": "1.0", "id": f"{vm}:incarnation:{n}:x", "source": f"vm://{vm}", "type": type_,
            "subject": vm, "time": "2026-11-21T00:00:00.000Z", "datacontenttype": "application/json",
            "partitionkey": vm, "data": {"vm": {"vmId": vm, "name": vm}, "incarnation": n, "pad": "p" * pad}}


def test_batches_split_when_full_and_arrive_in_order_in_one_partition(server: processes.Server) -> None:
    sent = [envelope("vm-a", n, pad=20_000) for n in range(120)]  # ~2.4 MB: at least three 1 MiB batches
    consumer = sent_and_read(server.port, "split", sent)
    got = consumer.items()
    assert len(got) == 120
    assert {r.partition for r in got} == {got[0].partition}  # one partition key -> one partition
    assert consumer.incarnations("vm-a") == list(range(120))
    assert all(r.content_type == CONTENT_TYPE and r.partition_key == "vm-a" for r in got)
    assert [r.envelope["id"] for r in sorted(got, key=lambda r: r.sequence)] == [e["id"] for e in sent]


def test_a_scale_sets_vms_share_its_partition_key_and_keep_their_own_order(server: processes.Server) -> None:
    """The hub's partition key is the VM's scale set (lower-cased, as central's budgets group it), so one
    instance owns a budget group's events; a VM in none keeps its vmId. Read back by the SDK's consumer."""
    def in_set(vm: str, n: int, scale_set: str) -> Dict[str, Any]:
        env = envelope(vm, n)
        env["data"]["vm"]["vmScaleSetName"] = scale_set
        return env

    mixed = [e for n in range(4) for e in (in_set("web-1", n, "Web"), in_set("web-2", n, "web"),
                                           envelope("solo", n))]
    consumer = sent_and_read(server.port, "sets", mixed)
    web = consumer.items(vm_id="web-1") + consumer.items(vm_id="web-2")
    assert len(web) == 8 and {r.partition_key for r in web} == {"scaleset:web"}
    assert len({r.partition for r in web}) == 1
    assert {r.partition_key for r in consumer.items(vm_id="solo")} == {"solo"}
    for vm in ("web-1", "web-2", "solo"):
        assert consumer.incarnations(vm) == [0, 1, 2, 3]


def test_partition_key_is_the_vm_id_for_every_run_of_envelopes(server: processes.Server) -> None:
    mixed = [envelope(vm, n) for n in range(5) for vm in ("vm-1", "vm-2", "vm-3")]
    consumer = sent_and_read(server.port, "keys", mixed)
    for vm in ("vm-1", "vm-2", "vm-3"):
        mine = consumer.items(vm_id=vm)
        assert len({r.partition for r in mine}) == 1 and {r.partition_key for r in mine} == {vm}
        assert consumer.incarnations(vm) == [0, 1, 2, 3, 4]


def test_an_envelope_too_large_for_any_batch_becomes_a_quarantined_note(server: processes.Server) -> None:
    sink = sink_for(server.port, "oversize")
    big = envelope("vm-big", 2, pad=1_500_000)
    try:
        sink.send([envelope("vm-big", 1), big, envelope("vm-big", 3)])
    finally:
        sink.close()
    assert sink.oversize_replaced == 1
    consumer = Consumer(processes.eventhubs_connection_string(server.port, "oversize")).start()
    try:
        wait_until(lambda: len(consumer.items()) >= 3, timeout=30, what="3 events")
    finally:
        consumer.close()
    got = sorted(consumer.items(), key=lambda r: r.sequence)
    assert [r.type for r in got] == ["scheduledevents.incarnation.v1", "scheduledevents.quarantined.v1",
                                     "scheduledevents.incarnation.v1"]
    note = got[1].envelope
    assert note["id"] == big["id"] + ":oversize" and note["partitionkey"] == "vm-big"
    assert schemas.errors("envelope.schema.json", note) == []
    assert note["data"]["rawTruncated"] is True and note["data"]["incarnation"] == 2
    assert "more than the 1048576 bytes" in note["data"]["errors"][0]["message"]


def test_unreachable_hub_raises_sink_error_and_a_new_client_is_built_when_it_returns(tmp_path: Path) -> None:
    port = processes.free_port()
    sink = sink_for(port, "late")
    with pytest.raises(SinkError) as failure:
        sink.send([envelope("vm-l", 1)])
    assert failure.value.retryable and "ConnectError" in str(failure.value)
    assert sink._client is None  # dropped after the failure, rebuilt on the next send
    srv = processes.start_eventhubs(["late=1"], port=port, log_dir=tmp_path)
    try:
        sink.send([envelope("vm-l", 2)])
        first = sink._client
        sink.send([envelope("vm-l", 3)])
        assert sink._client is first  # reused across sends
        sink.close()
        consumer = Consumer(processes.eventhubs_connection_string(port, "late")).start()
        try:
            wait_until(lambda: len(consumer.items()) >= 2, timeout=30, what="2 events")
        finally:
            consumer.close()
        assert consumer.incarnations("vm-l") == [2, 3]
    finally:
        srv.stop()


def test_settings_say_what_is_missing() -> None:
    with pytest.raises(EventHubConfigError, match="eventhub_namespace"):
        EventHubSettings().check()
    with pytest.raises(EventHubConfigError, match="eventhub_name"):
        EventHubSettings(namespace="ns.servicebus.windows.net").check()
    with pytest.raises(EventHubConfigError, match="not both"):
        EventHubSettings(namespace="ns.servicebus.windows.net", eventhub_name="h",
                         connection_string="Endpoint=sb://x;EntityPath=h").check()
    with pytest.raises(EventHubConfigError, match="EntityPath"):
        EventHubSettings(connection_string="Endpoint=sb://127.0.0.1:1;SharedAccessKey=k").check()
    with pytest.raises(EventHubConfigError, match="host name"):
        EventHubSettings(namespace="sb://ns.servicebus.windows.net/", eventhub_name="h").check()
    EventHubSettings(namespace="ns.servicebus.windows.net", eventhub_name="h").check()


def test_eventhub_is_the_default_sink_when_its_settings_are_given(tmp_path: Path) -> None:
    empty = tmp_path / "c.json"
    empty.write_text("{}")
    assert cfg.load({"config": str(empty)}, {}).sink == "file"
    given = cfg.load({"config": str(empty)}, {"SE_FORWARDER_EVENTHUB_NAMESPACE": "ns.servicebus.windows.net"})
    assert given.sink == "eventhub"
    explicit = cfg.load({"config": str(empty), "sink": "file",
                         "eventhub_connection_string": "Endpoint=sb://x"}, {})
    assert explicit.sink == "file"  # a sink chosen explicitly wins
    incomplete = cfg.load({"config": str(empty), "eventhub_namespace": "ns.servicebus.windows.net"}, {})
    with pytest.raises(sinks.SinkUnavailable, match="eventhub_name"):
        sinks.make(incomplete)


def test_envelopes_without_a_partition_key_are_refused_and_kept() -> None:
    sink = EventHubSink(EventHubSettings(connection_string="Endpoint=sb://127.0.0.1:1;EntityPath=h"),
                        client_factory=_no_client)
    bad: List[Dict[str, Any]] = [{"id": "x", "type": "t", "data": {}}]
    with pytest.raises(SinkError, match="no partitionkey") as failure:
        sink.send(bad)
    assert failure.value.retryable is False


def _no_client() -> Any:
    raise AssertionError("no client may be built for an envelope that cannot be keyed")


class Blackhole:
    """A TCP listener that accepts connections and never answers (a broken proxy or load balancer)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((processes.LOOPBACK, 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: List[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        """Stop listening first (a retry's new connection is then refused), then drop every connection."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)
        for conn in self.accepted:
            conn.close()


def test_a_peer_that_never_answers_cannot_hang_the_sink(tmp_path: Path) -> None:
    hole = Blackhole()
    sink = EventHubSink(EventHubSettings(
        connection_string=processes.eventhubs_connection_string(hole.port, "late"), operation_timeout=1.0))
    try:
        for _ in range(MAX_STUCK):
            with pytest.raises(SinkError, match="no answer from Event Hubs"):
                sink.send([envelope("vm-h", 1)])
        with pytest.raises(SinkError, match="still blocked"):  # no further thread is started
            sink.send([envelope("vm-h", 1)])
        assert len(hole.accepted) == MAX_STUCK
    finally:
        hole.close()  # the peer goes away: the blocked workers end
    wait_until(lambda: not any(t.is_alive() for t in sink._stuck), timeout=20,
               what="the blocked workers to end")
    srv = processes.start_eventhubs(["late=1"], port=hole.port, log_dir=tmp_path)
    try:
        sink.send([envelope("vm-h", 2)])  # a real hub on the same port: sends resume
        sink.close()
        consumer = Consumer(processes.eventhubs_connection_string(hole.port, "late")).start()
        try:
            wait_until(lambda: consumer.items(), timeout=20, what="the event sent after the blackhole")
        finally:
            consumer.close()
        assert consumer.incarnations("vm-h") == [2]
    finally:
        srv.stop()
