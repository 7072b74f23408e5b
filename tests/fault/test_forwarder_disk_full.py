"""The forwarder's disk full (issue 50): its state directory is a small tmpfs of its own (`mount -t tmpfs`,
as root), filled to the last byte by a file while Event Hubs is unreachable (sandbox/fault_proxy.py's
TcpGate), so the outbox can neither drain nor grow. Events keep coming from the IMDS simulator.

Must hold: the forwarder says so in one line (not one per poll), keeps running, and loses nothing it had
already accepted: once space is freed and the hub is back, every envelope that was in its outbox before the
disk filled is on the hub (read back straight from the server), and the VM's latest incarnation arrives
too. The recovery (space freed to the latest incarnation on the hub) is timed and printed.
Short form (`make test`): 3 events while full; full form (`make fault`): 20 events over a minute.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from sandbox import processes
from sandbox.fault_proxy import TcpGate
from tests.forwarder.helpers import wait_until
from tests.forwarder_eventhubs.helpers import Consumer, current_incarnation, eh_forwarder, schedule

from .pipeline_rig import FULL_FORM

HUB = "scheduled-events"
FORMS = {"short": {"events": 3, "spacing": 1.0}, "full": {"events": 20, "spacing": 3.0}}
TMPFS_SIZE = "4m"
DISK_FULL = "the state directory's disk is full"  # forwarder/daemon.py's one line about it
SPACE_AGAIN = "the state directory has space again"  # forwarder/outbox.py's, once a write succeeds


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of TMPFS_SIZE at tmp_path/state, unmounted afterwards (root only: fails loudly otherwise)."""
    mount = tmp_path / "state"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"cannot mount a tmpfs (root needed): {done.stderr.strip()}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem is full (ENOSPC); returns it."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as fh:
        for _ in range(100_000):  # bounded: far more than the tmpfs holds
            try:
                fh.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2]
                if not chunk:
                    break
    return filler


def outbox_ids(state: Path) -> List[str]:
    db = sqlite3.connect(f"file:{state / 'outbox.sqlite3'}?mode=ro", uri=True, timeout=10)
    try:
        return [r[0] for r in db.execute("SELECT id FROM outbox ORDER BY seq")]
    finally:
        db.close()


@pytest.mark.parametrize("form", ["short", FULL_FORM])
def test_forwarder_disk_full_says_so_keeps_running_loses_nothing(form: str, tmp_path: Path,
                                                                   small_disk: Path) -> None:
    size = FORMS[form]
    imds = processes.start_imds(log_dir=tmp_path)
    hub = processes.start_eventhubs([f"{HUB}=2"], log_dir=tmp_path)
    gate = TcpGate(hub.port).start()
    fw = eh_forwarder(imds, small_disk, processes.eventhubs_connection_string(gate.port, HUB),
                      extra=["--heartbeat-interval", "2"]).start()
    consumer = Consumer(processes.eventhubs_connection_string(hub.port, HUB)).start()
    try:
        wait_until(lambda: consumer.incarnations(), timeout=60, what="the first incarnation on the hub")
        gate.cut(3600)
        for _ in range(2):  # accepted while the hub is away: in the outbox only
            schedule(imds)
            time.sleep(1.5)
        wait_until(lambda: len(outbox_ids(small_disk)) >= 2, timeout=30, what="envelopes in the outbox")
        filler = fill(small_disk)
        accepted = outbox_ids(small_disk)  # the outbox as the disk filled: all of it must arrive
        log_mark = len(fw.logs())
        for _ in range(size["events"]):
            schedule(imds)
            time.sleep(size["spacing"])
        assert fw.alive(), f"the forwarder exited with {fw.proc.returncode} on a full disk"
        said = [entry for entry in fw.logs()[log_mark:] if entry.get("level") in ("warning", "error", "raw")]
        freed = time.monotonic()
        os.remove(filler)
        gate.restore()
        latest = current_incarnation(imds)
        wait_until(lambda: latest in consumer.incarnations(), timeout=120, step=0.5,
                   what=f"incarnation {latest} on the hub once space was freed")
        recovered = time.monotonic() - freed
        wait_until(lambda: set(accepted) <= {r.envelope["id"] for r in consumer.items()}, timeout=60,
                   what="every envelope accepted before the disk filled on the hub")
        assert fw.alive()
        again = [e for e in fw.logs()[log_mark:] if str(e.get("msg", "")).startswith(SPACE_AGAIN)]
        assert len(again) == 1, f"space again said {len(again)} times, not once"
    finally:
        consumer.close()
        if fw.alive():
            fw.terminate()
        gate.stop()
        hub.stop()
        imds.stop()
    about_disk = [e for e in said if str(e.get("msg", "")).startswith(DISK_FULL)]
    print(f"disk full with {len(accepted)} envelopes accepted, {size['events']} events while full: "
          f"{len(said)} warning/error lines ({len(about_disk)} about the disk): "
          f"{[e.get('msg') for e in said][:5]}; "
          f"latest incarnation on the hub {recovered:.1f} s after space was freed")
    assert len(about_disk) >= 1, f"nothing said about the full disk: {said}"
    assert len(about_disk) == 1, f"the full disk said more than once: {about_disk}"
