"""SIGKILL storm of the forwarder (real process, Event Hubs sink) during an Event Hubs outage.

The sandbox Event Hubs server is stopped; the IMDS simulator (time scale 60: one real second is one
simulated minute) keeps producing new incarnations for vm0 while the forwarder is SIGKILLed at random
instants, >= 100 times in the full form (10 in the short form), and restarted each time with the same
state directory. The outage lasts at least 10 simulated minutes. Then the server returns on the same
port with its `--data-dir`, and a real `EventHubConsumerClient` must see EVERY incarnation the
simulator produced (its counter is contiguous, so the history is first..last), in order, in one
partition; a repeat may only be a resend carrying the same CloudEvent id.

A new incarnation is produced only once the previous one is in the forwarder's outbox: IMDS shows only
the current document, so a change made and undone while no forwarder runs is invisible to any
forwarder (the design's at-least-once promise starts at the poll).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Dict, List

import pytest

from sandbox import processes
from tests.forwarder.helpers import admin, wait_until
from tests.forwarder_eventhubs.helpers import HUB, INCARNATION, Consumer, eh_forwarder, last_incarnation

TIME_SCALE = 60.0
MIN_OUTAGE_SIMULATED = 600.0  # 10 simulated minutes
KILLS = {"short": 10, "full": 110}
MAX_OUTSTANDING = 4  # scheduled events kept at once (the document stays small)


def document_incarnation(imds: processes.Server, vm: str = "vm0") -> int:
    return int(admin(imds, "GET", f"/vms/{vm}/document")["DocumentIncarnation"])


class Changer:
    """Makes one IMDS change at a time (schedule a far-off Freeze, or cancel one) and records the
    simulator's incarnation after each: the history the consumer is checked against."""

    def __init__(self, imds: processes.Server, rng: random.Random) -> None:
        self.imds = imds
        self.rng = rng
        self.outstanding: List[str] = []
        self.history: List[int] = [document_incarnation(imds)]

    def change(self) -> int:
        if self.outstanding and (len(self.outstanding) >= MAX_OUTSTANDING or self.rng.random() < 0.3):
            admin(self.imds, "POST", f"/events/{self.outstanding.pop(0)}/cancel")
        else:
            # A day of simulated notice: nothing starts on its own during the test.
            body = {"eventType": "Freeze", "resources": ["vm0"], "noticeSeconds": 86400}
            self.outstanding.append(str(admin(self.imds, "POST", "/events", body)["eventId"]))
        self.history.append(document_incarnation(self.imds))
        return self.history[-1]


@pytest.mark.parametrize("form", ["short", pytest.param("full", marks=pytest.mark.slow)])
def test_sigkill_storm_during_hub_outage_loses_no_incarnation(form: str, tmp_path: Path) -> None:
    rng = random.Random(7)  # noqa: S311 - reproducible fault timing, not cryptography
    kills = KILLS[form]
    data_dir = tmp_path / "eventhubs-data"
    imds = processes.start_imds(["--time-scale", str(TIME_SCALE)], log_dir=tmp_path)
    hub = processes.start_eventhubs([f"{HUB}=4"], log_dir=tmp_path, args=["--data-dir", str(data_dir)])
    conn = processes.eventhubs_connection_string(hub.port, HUB)
    state = tmp_path / "state"
    consumer = None
    fw = None
    try:
        changer = Changer(imds, rng)
        fw = eh_forwarder(imds, state, conn).start()
        wait_until(lambda: last_incarnation(state) == changer.history[-1], timeout=60,
                   what="the first incarnation in the outbox")
        hub.stop()
        outage_started = time.monotonic()
        killed = 0
        changes_while_dead = 0
        for _ in range(kills):
            life = rng.uniform(0.05, 2.0)
            change_at = rng.uniform(0.0, life)
            time.sleep(change_at)
            if last_incarnation(state) == changer.history[-1]:
                changer.change()  # while this forwarder incarnation runs, at a random instant
            time.sleep(life - change_at)
            fw.kill()
            killed += 1
            if rng.random() < 0.3 and last_incarnation(state) == changer.history[-1]:
                changer.change()  # while no forwarder runs: the next one must find it
                changes_while_dead += 1
            fw = eh_forwarder(imds, state, conn).start()
        wait_until(lambda: last_incarnation(state) == changer.history[-1], timeout=60,
                   what="the last forwarder to record the latest incarnation")
        remaining = MIN_OUTAGE_SIMULATED / TIME_SCALE - (time.monotonic() - outage_started)
        if remaining > 0:
            time.sleep(remaining)
        outage_simulated = (time.monotonic() - outage_started) * TIME_SCALE
        hub = processes.start_eventhubs([f"{HUB}=4"], log_dir=tmp_path, port=hub.port,
                                        args=["--data-dir", str(data_dir)])
        consumer = Consumer(conn).start()
        expected = list(range(changer.history[0], changer.history[-1] + 1))
        wait_until(lambda: set(consumer.incarnations()) >= set(expected), timeout=120, step=0.5,
                   what="every incarnation at the consumer")
        assert fw.terminate() == 0
    finally:
        if fw is not None and fw.alive():
            fw.kill()
        if consumer is not None:
            consumer.close()
        hub.stop()
        imds.stop()

    assert killed == kills
    assert outage_simulated >= MIN_OUTAGE_SIMULATED
    # The simulator's counter moves by one per change: its history is contiguous, nothing skipped.
    assert changer.history == expected, "every change produced exactly one new incarnation"
    mine = sorted(consumer.items(INCARNATION), key=lambda r: (r.partition, r.sequence))
    assert len({r.partition for r in mine}) == 1, "one VM's envelopes share one partition"
    ids: Dict[int, set] = {}
    first_seen: List[int] = []
    for r in mine:
        n = int(r.envelope["data"]["incarnation"])
        ids.setdefault(n, set()).add(r.envelope["id"])
        if n not in first_seen:
            first_seen.append(n)
    assert first_seen == expected, "every incarnation, none lost, in the simulator's order"
    assert all(len(v) == 1 for v in ids.values()), f"a repeat with a new id: {ids}"
    duplicates = len(mine) - len(first_seen)
    print(f"kills={killed} changes={len(expected) - 1} (while dead {changes_while_dead}) "
          f"outage={outage_simulated:.0f} simulated s; resends={duplicates}")
