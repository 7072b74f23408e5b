"""What many forwarders publish, made up for the fleet benchmarks (bench.fleet_scale, bench.fleet_units):
the fleet's heartbeats with a maintenance wave's incarnations, each signed as its VM's forwarder signs it
(central runs in its default AUTHN_MODE=required), sent to the partition its VM's scale set picks."""

from __future__ import annotations

import json
import zlib
from datetime import datetime, timezone
from typing import Dict, List

from azure.eventhub import EventData, EventHubProducerClient

from bench.central_throughput import FakeVm
from forwarder.envelope import hub_partition_key
from sandbox.imds.signer import Signer

HUB = "scheduled-events"
PARTITIONS = 4


def fleet_envelopes(vms: List[FakeVm], minutes: int, wave: float) -> List[bytes]:
    """`minutes` of heartbeats from every VM (one per VM per minute, in time order) with the maintenance
    wave's incarnations (one new Scheduled event each) in the middle."""
    now = datetime.now(timezone.utc)
    out: List[bytes] = []
    wave_vms = vms[: max(1, int(len(vms) * wave))]
    for minute in range(minutes):
        out += [vm.heartbeat(now) for vm in vms]
        if minute == minutes // 2:
            out += [vm.incarnation_env(now, with_event=True) for vm in wave_vms]
    return out


SIGNER = Signer(timeless=True)  # central runs in its default AUTHN_MODE=required: forwarders sign


def _signed(body: bytes) -> EventData:
    data = EventData(body)
    data.properties = dict(SIGNER.as_claimed([body])[0] or {})
    return data


def partition_of(body: bytes) -> int:
    """The partition `publish` sends an envelope to: its hub partition key's (the forwarder's: the VM's scale
    set), hashed as the sandbox's Event Hubs server hashes it."""
    return zlib.crc32(hub_partition_key(json.loads(body)).encode()) % PARTITIONS


def warmup_vms() -> List[FakeVm]:
    """One VM outside the fleet per partition: their heartbeats reach every partition's owner."""
    by_partition: Dict[int, FakeVm] = {}
    index = 10**6
    while len(by_partition) < PARTITIONS:
        vm = FakeVm(index)
        by_partition.setdefault(partition_of(vm.heartbeat(datetime.now(timezone.utc))), vm)
        index += 1
    return list(by_partition.values())


def send_signed(producer: EventHubProducerClient, bodies: List[bytes]) -> None:
    """Many forwarders' sends arriving at the hub, each signed by its VM, grouped per partition (as the hub
    stores them)."""
    per_partition: Dict[int, List[bytes]] = {p: [] for p in range(PARTITIONS)}
    for body in bodies:
        per_partition[partition_of(body)].append(body)
    for pid, items in per_partition.items():
        batch = producer.create_batch(partition_id=str(pid))
        for body in items:
            try:
                batch.add(_signed(body))
            except ValueError:  # full: send it, start the next
                producer.send_batch(batch)
                batch = producer.create_batch(partition_id=str(pid))
                batch.add(_signed(body))
        if len(batch):
            producer.send_batch(batch)


def publish(conn: str, bodies: List[bytes]) -> None:
    with EventHubProducerClient.from_connection_string(conn) as producer:
        send_signed(producer, bodies)
