"""The durable outbox: atomic put + state, peek/ack, the bound policy, crash safety under SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from forwarder.outbox import Outbox


def env(n: int, kind: str = "incarnation") -> dict:
    return {"id": f"vm:{kind}:{n}", "type": f"scheduledevents.{kind}.v1", "n": n}


def test_put_peek_ack_and_state_survive_reopen(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.put(env(1), state={"last_incarnation": 1})
    box.put(env(2), state={"last_incarnation": 2})
    items = box.peek(10)
    assert [i.envelope["n"] for i in items] == [1, 2]
    box.ack([items[0].seq])
    box.close()
    again = Outbox(tmp_path)
    assert [i.envelope["n"] for i in again.peek(10)] == [2]  # an acked row never comes back
    assert again.get_state("last_incarnation") == 2
    assert again.last_send_at is not None and again.backlog() == 1
    again.close()


def test_journal_mode_is_wal_and_sync_full(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    assert box._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert box._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    box.close()


def test_a_failed_put_changes_nothing(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.put(env(1), state={"last_incarnation": 1})
    try:
        box.put({"type": "scheduledevents.incarnation.v1"}, state={"last_incarnation": 2})  # no id
    except KeyError:
        pass
    assert box.get_state("last_incarnation") == 1 and box.backlog() == 1
    box.close()


def test_full_outbox_drops_oldest_heartbeats_first_then_oldest_others_and_counts(tmp_path: Path) -> None:
    box = Outbox(tmp_path, max_rows=4)
    box.put(env(1))
    box.put(env(100, "heartbeat"))
    box.put(env(2))
    box.put(env(101, "heartbeat"))
    box.put(env(3))  # full: the oldest heartbeat goes
    assert [i.envelope["n"] for i in box.peek(10)] == [1, 2, 101, 3]
    box.put(env(4))  # the other heartbeat goes
    assert [i.envelope["n"] for i in box.peek(10)] == [1, 2, 3, 4]
    box.put(env(5))  # no heartbeat left: the oldest incarnation goes, the newest stay
    assert [i.envelope["n"] for i in box.peek(10)] == [2, 3, 4, 5]
    assert box.dropped() == 3
    assert box.stats()["dropped"] == 3 and box.stats()["backlog"] == 4
    box.close()
    assert Outbox(tmp_path, max_rows=4).dropped() == 3  # counted persistently


CHILD = r"""
import json, os, sys
from pathlib import Path
from forwarder.outbox import Outbox
state_dir, sent_path = Path(sys.argv[1]), Path(sys.argv[2])
box = Outbox(state_dir, max_rows=100000)
n = box.get_state("last_incarnation", 0)
sent = open(sent_path, "a")
acked = open(str(sent_path) + ".acked", "a")
print("ready", flush=True)
while True:
    n += 1
    box.put({"id": f"vm:incarnation:{n}", "type": "scheduledevents.incarnation.v1", "n": n},
            state={"last_incarnation": n, "last_document": {"n": n}})
    if n % 3 == 0:  # a sink: deliver (fsync) then ack
        items = box.peek(50)
        sent.write("".join(json.dumps(i.envelope["n"]) + "\n" for i in items))
        sent.flush(); os.fsync(sent.fileno())
        box.ack([i.seq for i in items])
        acked.write(f"{items[-1].envelope['n']}\n"); acked.flush(); os.fsync(acked.fileno())
"""


def test_sigkill_at_any_instant_loses_nothing_and_keeps_state_consistent(tmp_path: Path) -> None:
    state_dir, sent_path = tmp_path / "state", tmp_path / "sent.jsonl"
    delays = [0.05, 0.11, 0.17, 0.23, 0.08, 0.3, 0.13, 0.2]
    for delay in delays:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(state_dir), str(sent_path)],
                                stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
    box = Outbox(state_dir)
    last = box.get_state("last_incarnation")
    assert box.get_state("last_document") == {"n": last}  # state and document moved together
    pending = [i.envelope["n"] for i in box.peek(1_000_000)]
    sent = [json.loads(line) for line in sent_path.read_text().splitlines()] if sent_path.exists() else []
    assert last and last > len(delays)
    assert pending == sorted(set(pending))  # in order, no duplicate rows
    assert max(pending + sent) == last  # the state never ran ahead of (or behind) the rows
    assert set(pending) | set(sent) == set(range(1, last + 1))  # nothing lost, nothing skipped
    # An acknowledged row never comes back (acks go oldest first, so every pending row is newer).
    acked_path = Path(str(sent_path) + ".acked")
    acked = [int(x) for x in acked_path.read_text().split()] if acked_path.exists() else []
    assert acked, "the child never acknowledged anything; the test proved nothing"
    assert all(n > max(acked) for n in pending)
    box.close()
