"""The forwarder as a real process (`python -m forwarder run --sink eventhub`) against the IMDS
simulator and the sandbox Event Hubs server over AMQP, read by real EventHubConsumerClients.

"Nothing lost, nothing out of order" is checked against what each forwarder itself recorded: every
incarnation it observed (its outbox state after each change) must arrive, in order, in one
partition per VM; a duplicate may only be a resend carrying the same CloudEvent id.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

import schemas
from forwarder.outbox import Outbox
from sandbox import processes

from .helpers import (
    HEARTBEAT,
    HUB,
    INCARNATION,
    QUARANTINED,
    Consumer,
    Received,
    change_and_wait_in_outbox,
    check_report,
    current_incarnation,
    eh_forwarder,
    last_incarnation,
    schedule,
    wait_seconds,
    wait_until,
)

OUTAGE_SECONDS = 3.0  # the hub stays down at least this long


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "eventhubs-data"


@pytest.fixture
def hub(tmp_path: Path, data_dir: Path) -> Iterator[Dict[str, processes.Server]]:
    """The server with a data dir, so a restart on the same port keeps what it had. The dict lets a
    test replace the server; whatever is in it at the end is stopped."""
    box = {"server": processes.start_eventhubs([f"{HUB}=4"], log_dir=tmp_path,
                                               args=["--data-dir", str(data_dir)])}
    yield box
    box["server"].stop()


def restart(box: Dict[str, processes.Server], tmp_path: Path, data_dir: Path) -> None:
    port = box["server"].port
    box["server"] = processes.start_eventhubs([f"{HUB}=4"], log_dir=tmp_path, port=port,
                                              args=["--data-dir", str(data_dir)])


def conn(box: Dict[str, processes.Server]) -> str:
    return processes.eventhubs_connection_string(box["server"].port, HUB)


def first_incarnation(state_dir: Path) -> int:
    return int(wait_until(lambda: last_incarnation(state_dir), timeout=20, what="the first incarnation"))


def assert_in_order_once_per_id(received: List[Received], vm_id: str, expected: List[int]) -> None:
    """Every expected incarnation, in order, in one partition; any repeat is a resend (same id)."""
    mine = sorted((r for r in received if r.type == INCARNATION and r.vm_id == vm_id),
                  key=lambda r: r.sequence)
    assert len({r.partition for r in mine}) == 1, "one VM's envelopes must share one partition"
    scale_set = mine[0].envelope["data"]["vm"].get("vmScaleSetName") if mine else None
    assert {r.partition_key for r in mine} == {f"scaleset:{scale_set.lower()}" if scale_set else vm_id}
    ids_by_number: Dict[int, set] = {}
    for r in mine:
        ids_by_number.setdefault(r.envelope["data"]["incarnation"], set()).add(r.envelope["id"])
    assert all(len(ids) == 1 for ids in ids_by_number.values()), f"a repeat with a new id: {ids_by_number}"
    first_seen: List[int] = []
    for r in mine:
        n = r.envelope["data"]["incarnation"]
        if n not in first_seen:
            first_seen.append(n)
    assert first_seen == expected


def test_two_vms_every_incarnation_in_order_within_its_partition(
        imds2: processes.Server, hub: Dict[str, processes.Server], tmp_path: Path) -> None:
    fws = {vm: eh_forwarder(imds2, tmp_path / f"state-{vm}", conn(hub), vm=vm).start()
           for vm in ("vm0", "vm1")}
    consumer = Consumer(conn(hub)).start()
    try:
        expected = {vm: [first_incarnation(fw.state_dir)] for vm, fw in fws.items()}
        for _ in range(3):
            for vm, fw in fws.items():
                expected[vm].append(change_and_wait_in_outbox(imds2, fw, vm))
        vm_ids = {}
        for vm in fws:
            wait_until(lambda vm=vm: [r for r in consumer.items(INCARNATION)
                                      if r.envelope["subject"] == vm
                                      and r.envelope["data"]["incarnation"] == expected[vm][-1]],
                       timeout=20, what=f"{vm}'s last incarnation at the consumer")
            vm_ids[vm] = next(r.vm_id for r in consumer.items(INCARNATION) if r.envelope["subject"] == vm)
    finally:
        for fw in fws.values():
            assert fw.terminate() == 0
        consumer.close()
    received = consumer.items()
    assert vm_ids["vm0"] != vm_ids["vm1"]
    for vm, vm_id in vm_ids.items():
        assert_in_order_once_per_id(received, vm_id, expected[vm])
    assert all(r.content_type == "application/cloudevents+json; charset=utf-8" for r in received)
    assert all(schemas.errors("envelope.schema.json", r.envelope) == [] for r in received)


def test_hub_outage_the_outbox_drains_in_order_and_a_heartbeat_follows_recovery(
        imds_server: processes.Server, hub: Dict[str, processes.Server], tmp_path: Path,
        data_dir: Path) -> None:
    # A long heartbeat interval: a heartbeat after recovery can only be the recovery beat.
    fw = eh_forwarder(imds_server, tmp_path / "state", conn(hub),
                      extra=["--heartbeat-interval", "3600"]).start()
    try:
        state = fw.state_dir
        expected = [first_incarnation(state)]
        wait_until(lambda: _backlog(state) == 0, timeout=20, what="the first incarnation sent")
        hub["server"].stop()
        for _ in range(2):
            expected.append(change_and_wait_in_outbox(imds_server, fw))
        wait_until(lambda: _last_error(state), timeout=20, what="a failed send recorded")
        during = check_report(imds_server, state, conn(hub))
        assert during["outbox"]["backlog"] >= 2 and during["outbox"]["lastError"]
        assert during["outbox"]["lastErrorAt"]
        assert during["sink"] == {"name": "eventhub", "target": f"127.0.0.1:{hub['server'].port}/{HUB}",
                                  "auth": "connection string"}
        wait_seconds(OUTAGE_SECONDS)
        restart(hub, tmp_path, data_dir)
        wait_until(lambda: _backlog(state) == 0 and not _last_error(state), timeout=45,
                   what="the outbox drained after the hub returned")
        after = check_report(imds_server, state, conn(hub))
        assert after["outbox"]["backlog"] == 0 and after["outbox"]["lastError"] is None
        assert after["outbox"]["lastSendAt"] > during["outbox"]["lastErrorAt"]
        consumer = Consumer(conn(hub)).start()
        try:
            wait_until(lambda: _has(consumer, expected[-1]), timeout=20, what="the last incarnation")
            beats = wait_until(lambda: [r for r in consumer.items(HEARTBEAT)
                                        if r.envelope["data"]["outbox"]["lastError"] is None
                                        and r.envelope["time"] > during["outbox"]["lastErrorAt"]],
                               timeout=20, what="a heartbeat after recovery")
        finally:
            consumer.close()
    finally:
        assert fw.terminate() == 0
    vm_id = consumer.items(INCARNATION)[0].vm_id
    assert_in_order_once_per_id(consumer.items(), vm_id, expected)
    assert beats[0].envelope["data"]["outbox"]["dropped"] == 0


def test_forwarder_sigkilled_during_the_outage_loses_nothing_after_its_restart(
        imds_server: processes.Server, hub: Dict[str, processes.Server], tmp_path: Path,
        data_dir: Path) -> None:
    state = tmp_path / "state"
    fw = eh_forwarder(imds_server, state, conn(hub)).start()
    expected = [first_incarnation(state)]
    hub["server"].stop()
    expected.append(change_and_wait_in_outbox(imds_server, fw))
    fw.kill()
    schedule(imds_server)  # the VM moves on while the forwarder is dead; the restarted one must see it
    expected.append(current_incarnation(imds_server))
    fw = eh_forwarder(imds_server, state, conn(hub)).start()
    try:
        wait_until(lambda: last_incarnation(state) == expected[-1], timeout=20,
                   what="the restarted forwarder to record the change made while it was dead")
        wait_seconds(1.0)
        restart(hub, tmp_path, data_dir)
        consumer = Consumer(conn(hub)).start()
        try:
            wait_until(lambda: _has(consumer, expected[-1]), timeout=45, what="the last incarnation")
        finally:
            consumer.close()
    finally:
        assert fw.terminate() == 0
    vm_id = consumer.items(INCARNATION)[0].vm_id
    assert_in_order_once_per_id(consumer.items(), vm_id, expected)
    assert _backlog(state) == 0


def test_full_outbox_drops_heartbeats_first_and_the_count_arrives_after_recovery(
        imds_server: processes.Server, hub: Dict[str, processes.Server], tmp_path: Path,
        data_dir: Path) -> None:
    state = tmp_path / "state"
    fw = eh_forwarder(imds_server, state, conn(hub),
                      extra=["--outbox-max-rows", "4", "--heartbeat-interval", "0.2"]).start()
    try:
        expected = [first_incarnation(state)]
        wait_until(lambda: _pending_incarnations(state) == 0, timeout=20, what="the first incarnation sent")
        hub["server"].stop()
        for _ in range(3):
            expected.append(change_and_wait_in_outbox(imds_server, fw))
        dropped = wait_until(lambda: _dropped(state) >= 3, timeout=20,
                             what="heartbeats dropped from the full outbox")
        assert _pending_incarnations(state) == 3  # the heartbeats went, every incarnation stayed
        restart(hub, tmp_path, data_dir)
        consumer = Consumer(conn(hub)).start()
        try:
            wait_until(lambda: _has(consumer, expected[-1]), timeout=45, what="the last incarnation")
            reported = wait_until(lambda: [r for r in consumer.items(HEARTBEAT)
                                           if r.envelope["data"]["outbox"]["dropped"] >= dropped],
                                  timeout=20, what="a heartbeat reporting the dropped count")
        finally:
            consumer.close()
    finally:
        assert fw.terminate() == 0
    vm_id = consumer.items(INCARNATION)[0].vm_id
    assert_in_order_once_per_id(consumer.items(), vm_id, expected)  # no incarnation was dropped
    assert max(r.envelope["data"]["outbox"]["dropped"] for r in reported) <= _dropped(state)


def test_an_envelope_too_large_for_the_hub_does_not_block_the_outbox(
        imds_server: processes.Server, hub: Dict[str, processes.Server], tmp_path: Path) -> None:
    state = tmp_path / "state"
    fw = eh_forwarder(imds_server, state, conn(hub), extra=["--heartbeat-interval", "3600"]).start()
    consumer = Consumer(conn(hub)).start()
    try:
        first = first_incarnation(state)
        original = wait_until(lambda: [r for r in consumer.items(INCARNATION)
                                       if r.envelope["data"]["incarnation"] == first],
                              timeout=20, what="the first incarnation")[0].envelope
        # A 1.5 MB envelope (more than the hub's 1 MiB per event) queued as the forwarder would.
        big = json.loads(json.dumps(original))
        big["id"] = original["id"] + ":big"
        big["data"]["padding"] = "x" * 1_500_000
        box = Outbox(state)
        try:
            box.put(big)
        finally:
            box.close()
        after = change_and_wait_in_outbox(imds_server, fw)
        wait_until(lambda: _has(consumer, after), timeout=20, what="the incarnation queued after the big one")
    finally:
        assert fw.terminate() == 0
        consumer.close()
    notes = consumer.items(QUARANTINED)
    assert [n.envelope["id"] for n in notes] == [big["id"] + ":oversize"]
    assert schemas.errors("envelope.schema.json", notes[0].envelope) == []
    assert "more than the 1048576 bytes" in notes[0].envelope["data"]["errors"][0]["message"]
    ordered = sorted(consumer.items(), key=lambda r: r.sequence)
    kinds = [(r.type, r.envelope["data"].get("incarnation")) for r in ordered if r.type != HEARTBEAT]
    assert kinds == [(INCARNATION, first), (QUARANTINED, first), (INCARNATION, after)]
    assert _backlog(state) == 0
    assert any(line.get("msg", "").startswith("envelope larger than the hub accepts") for line in fw.logs())


# ---- small readers -------------------------------------------------------------------------------

def _has(consumer: Consumer, incarnation: int) -> bool:
    return any(r.envelope["data"]["incarnation"] == incarnation for r in consumer.items(INCARNATION))


def _last_error(state: Path) -> object:
    value = _read(state, "SELECT value FROM state WHERE key = 'last_error'")
    return json.loads(str(value)) if value is not None else None


def _read(state: Path, sql: str) -> object:
    db = sqlite3.connect(f"file:{state / 'outbox.sqlite3'}?mode=ro", uri=True, timeout=10)
    try:
        row = db.execute(sql).fetchone()
        return row[0] if row else None
    finally:
        db.close()


def _pending_incarnations(state: Path) -> int:
    return int(_read(state, f"SELECT COUNT(*) FROM outbox WHERE type = '{INCARNATION}'") or 0)  # noqa: S608


def _backlog(state: Path) -> int:
    return int(_read(state, "SELECT COUNT(*) FROM outbox") or 0)


def _dropped(state: Path) -> int:
    value = _read(state, "SELECT value FROM state WHERE key = 'dropped'")
    return int(json.loads(str(value))) if value is not None else 0
