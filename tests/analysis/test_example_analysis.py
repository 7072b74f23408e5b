"""The example analysis (examples/analysis) on a real capture: envelopes published through the azure-eventhub
SDK to the sandbox hub with Capture on, Avro files in Azurite, the analysis CLI run as a process."""

from __future__ import annotations

import copy
import io
import json
import struct
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

import fastavro
import pytest
from azure.eventhub import EventData, EventHubProducerClient
from azure.storage.blob import BlobServiceClient

import schemas
from examples.analysis import questions, report
from sandbox import processes

EXAMPLES = processes.REPO / "schemas" / "examples" / "envelope"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)  # a Sunday: ISO week 2026-W09; T0 + 1 day is W10


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _rfc1123(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def _vm(name: str, role: str) -> Dict[str, Any]:
    vm = copy.deepcopy(json.loads((EXAMPLES / "incarnation.json").read_text())["data"]["vm"])
    vm.update(vmId=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)), name=name, tags={"role": role})
    return vm


VMS = {"vm-a": _vm("vm-a", "web"), "vm-b": _vm("vm-b", "db"), "vm-c": _vm("vm-c", "db")}


def _event(event_id: str, event_type: str, resources: List[str],
           not_before: Optional[datetime]) -> Dict[str, Any]:
    return {"EventId": event_id, "EventStatus": "Scheduled" if not_before else "Started",
            "EventType": event_type,
            "ResourceType": "VirtualMachine", "Resources": resources,
            "NotBefore": _rfc1123(not_before) if not_before else "", "Description": "",
            "EventSource": "Platform", "DurationInSeconds": -1}


def incarnation(vm: str, number: int, at: datetime, events: List[Dict[str, Any]]) -> Dict[str, Any]:
    env = json.loads((EXAMPLES / "incarnation.json").read_text())
    identity = VMS[vm]
    env.update(id=f"{identity['vmId']}:incarnation:{number}:{uuid.uuid4().hex[:16]}", subject=vm,
               partitionkey=identity["vmId"], time=_iso(at), source=f"vm://{identity['vmId']}")
    env["data"].update(vm=identity, incarnation=number, previousIncarnation=number - 1, observedAt=_iso(at),
                       document={"DocumentIncarnation": number, "Events": events},
                       diff={"new": events, "changed": [], "gone": []})
    assert schemas.errors("envelope.schema.json", env) == []
    return env


def approved(vm: str, event_id: str, at: datetime) -> Dict[str, Any]:
    env = json.loads((EXAMPLES / "approvalresult.json").read_text())
    identity = VMS[vm]
    env.update(id=f"{identity['vmId']}:approvalresult:{event_id}:approved", subject=vm,
               partitionkey=identity["vmId"], time=_iso(at), source=f"vm://{identity['vmId']}")
    env["data"].update(vm=identity, eventId=event_id, at=_iso(at))
    assert schemas.errors("envelope.schema.json", env) == []
    return env


def heartbeat(vm: str, at: datetime) -> Dict[str, Any]:
    env = json.loads((EXAMPLES / "heartbeat.json").read_text())
    identity = VMS[vm]
    env.update(id=f"{identity['vmId']}:heartbeat:{_iso(at)}", subject=vm, partitionkey=identity["vmId"],
               time=_iso(at), source=f"vm://{identity['vmId']}")
    env["data"]["vm"] = identity
    assert schemas.errors("envelope.schema.json", env) == []
    return env


def fleet_story() -> List[Dict[str, Any]]:
    """Known answers: Reboot notice 900 s, lead 840 s; Freeze notice 300 s (vm-b saw it first), lead 290 s;
    Redeploy notice 1800 s, NotBefore moved later by 600 s before its approval: lead 2100 s."""
    reboot = _event("E-REBOOT", "Reboot", ["vm-a"], T0 + timedelta(minutes=15))
    freeze = _event("E-FREEZE", "Freeze", ["vm-b", "vm-c"], T0 + timedelta(days=1, minutes=5))
    redeploy = _event("E-REDEPLOY", "Redeploy", ["vm-a"], T0 + timedelta(hours=2, minutes=30))
    moved = dict(redeploy, NotBefore=_rfc1123(T0 + timedelta(hours=2, minutes=40)))
    day2 = T0 + timedelta(days=1)
    return [
        heartbeat("vm-a", T0 - timedelta(minutes=1)),
        incarnation("vm-a", 1, T0, [reboot]),
        approved("vm-a", "E-REBOOT", T0 + timedelta(seconds=60)),
        incarnation("vm-a", 2, T0 + timedelta(hours=2), [redeploy]),
        incarnation("vm-a", 3, T0 + timedelta(hours=2, minutes=1), [moved]),
        approved("vm-a", "E-REDEPLOY", T0 + timedelta(hours=2, minutes=5)),
        incarnation("vm-b", 1, day2, [freeze]),
        incarnation("vm-c", 1, day2 + timedelta(seconds=4), [freeze]),
        approved("vm-b", "E-FREEZE", day2 + timedelta(seconds=10)),
    ]


# ---- the pure questions ------------------------------------------------------------------------

def test_questions_answer_the_story() -> None:
    story = fleet_story()
    seen = questions.sightings(story)
    notice = {t: s.median for t, s in ((s.key, s) for s in questions.by_type(questions.notice_seconds(seen)))}
    assert notice == {"Freeze": 300.0, "Reboot": 900.0, "Redeploy": 1800.0}
    lead = {s.key: s.median for s in questions.by_type(questions.approval_lead_seconds(story, seen))}
    assert lead == {"Freeze": 290.0, "Reboot": 840.0, "Redeploy": 2100.0}
    assert questions.events_per_group_week(seen, "tag:role") == \
        {("db", "2026-W10"): 1, ("web", "2026-W09"): 2}
    assert questions.events_per_group_week(seen, "scaleSet") == {("(none)", "2026-W09"): 2,
                                                                  ("(none)", "2026-W10"): 1}


def test_an_event_first_seen_started_has_no_notice() -> None:
    started = incarnation("vm-a", 1, T0, [_event("E-LATE", "Freeze", ["vm-a"], None)])
    assert questions.notice_seconds(questions.sightings([started])) == []


def test_the_figure_states_its_source_shows_n_and_no_whiskers_on_single_events() -> None:
    """Each bar carries its n; only a bar drawn from several events has min-max whiskers; one unit (s);
    the header says the source, time range, counts and a time scale that is not real time."""
    story = fleet_story()
    # a second Reboot, 10 minutes' notice: n=2 for Reboot
    extra = incarnation("vm-b", 2, T0, [_event("E-REBOOT-2", "Reboot", ["vm-b"], T0 + timedelta(minutes=10))])
    seen = questions.sightings([*story, extra])
    notice = questions.by_type(questions.notice_seconds(seen))
    assert {s.key: s.count for s in notice} == {"Freeze": 1, "Reboot": 2, "Redeploy": 1}
    provenance = report.Provenance(source="Capture files in ./capture", files=2, records=9, envelopes=8,
                                   duplicates=1, first="2026-03-01T00:00:00Z", last="2026-03-05T00:00:00Z",
                                   time_scale=5)
    answers = report.Answers(notice, [], {("web", "2026-W09"): 2}, "tag:role", provenance)
    fig = report.figure(answers)
    try:
        notice_axes, lead_axes, weekly_axes = fig.axes
        labels = [t.get_text() for t in notice_axes.texts]
        assert labels == ["n=1", "n=2", "n=1"]  # Freeze, Reboot, Redeploy
        whiskers = [c for c in notice_axes.containers if type(c).__name__ == "ErrorbarContainer"]
        assert len(whiskers) == 1 and len(whiskers[0].lines[2][0].get_segments()) == 1  # Reboot's only
        assert [c for c in lead_axes.containers if type(c).__name__ == "ErrorbarContainer"] == []
        assert [t.get_text() for t in weekly_axes.texts] == ["n=2"]
        assert "seconds" in notice_axes.get_ylabel() and "minutes" not in notice_axes.get_ylabel()
        header = fig._suptitle.get_text()
        for part in ("Source: Capture files in ./capture", "2026-03-01T00:00:00Z to 2026-03-05T00:00:00Z",
                     "Envelopes: 8 from 9 record(s) in 2 file(s); 1 duplicate(s) dropped",
                     "Time scale: 5x", "shows as 180 s"):
            assert part in header, header
    finally:
        report.plt.close(fig)
    text = report.markdown(answers)
    assert "- Time scale: 5x" in text and "| Reboot | 2 |" in text and "n (events)" in text


def test_unknown_group_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="tag:<name>"):
        questions.group_of({}, "rack")


# ---- the whole path: SDK -> sandbox hub with Capture -> Azurite -> the analysis CLI ------------------

def _publish(server: processes.Server, hub: str, bodies: List[tuple]) -> None:
    conn = processes.eventhubs_connection_string(server.port, hub)
    with EventHubProducerClient.from_connection_string(conn, retry_total=1) as client:
        for key, body in bodies:
            batch = client.create_batch(partition_key=key)
            batch.add(EventData(body))
            client.send_batch(batch)


def _png_size(data: bytes) -> tuple:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_analysis_of_a_real_capture(azurite: processes.Server, tmp_path: Path) -> None:
    container = f"capture-{uuid.uuid4().hex[:10]}"
    conn = azurite.extra["connection_string"]
    server = processes.start_eventhubs(
        ["scheduled-events=2"], log_dir=tmp_path,
        args=["--capture-connection-string", conn, "--capture-container", container,
              "--capture-interval", "1"])
    story = fleet_story()
    bodies = [(env["partitionkey"], json.dumps(env).encode()) for env in story]
    bodies.append(bodies[1])  # a resend: same id, dropped by the analysis
    bodies.append(("vm-x", b"not json"))  # unreadable: counted, not fatal
    try:
        _publish(server, "scheduled-events", bodies)
        blobs = BlobServiceClient.from_connection_string(conn).get_container_client(container)
        deadline = time.monotonic() + 30
        while _records(blobs) < len(bodies):  # Capture closes a window every second
            assert time.monotonic() < deadline, "the capture never held every record"
            time.sleep(0.5)
    finally:
        server.stop()
    out = _run_analysis(conn, container, tmp_path / "out")
    png = (tmp_path / "out" / "summary.png").read_bytes()
    assert _png_size(png) == (1500, 550)  # 15 x 5.5 in at 100 dpi
    assert len(png) > 10_000  # three panels with bars and labels, not a blank canvas
    table = (tmp_path / "out" / "summary.md").read_text()
    for row in ["| Reboot | 1 | 900 | 900 | 900 |", "| Freeze | 1 | 300 | 300 | 300 |",
                "| Redeploy | 1 | 1800 | 1800 | 1800 |",
                "| Reboot | 1 | 840 | 840 | 840 |", "| Freeze | 1 | 290 | 290 | 290 |",
                "| Redeploy | 1 | 2100 | 2100 | 2100 |",
                "| web | 2026-W09 | 2 |", "| db | 2026-W10 | 1 |"]:
        assert row in table, f"{row!r} missing from\n{table}"
    assert f"{len(bodies)} record(s): {len(story)} envelope(s), 1 duplicate(s) dropped, 1 unreadable" in out
    # the summary stands alone: source, time range, counts, time scale, one unit
    times = sorted(env["time"] for env in story)
    assert f"- Source: Capture container {container}/ in Azurite (connection string)" in table
    assert f"- Time range: {times[0]} to {times[-1]}" in table
    assert (f"- Envelopes: {len(story)} from {len(bodies)} record(s) in" in table
            and "1 duplicate(s) dropped, 1 unreadable, 0 invalid" in table)
    assert "- Time scale: 1 (real time)" in table and "minutes" not in table.lower()


def _records(blobs: Any) -> int:
    if not blobs.exists():
        return 0
    return sum(len(list(fastavro.reader(io.BytesIO(blobs.download_blob(b.name).readall()))))
               for b in blobs.list_blobs())


def _run_analysis(conn: str, container: str, out_dir: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "examples.analysis", "--connection-string", conn, "--container", container,
         "--group-by", "tag:role", "--out", str(out_dir)],
        cwd=processes.REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    bad_group = subprocess.run(
        [sys.executable, "-m", "examples.analysis", "--dir", str(tmp_path), "--group-by", "rack"],
        cwd=processes.REPO, capture_output=True, text=True, timeout=60)
    assert bad_group.returncode == 2 and "tag:<name>" in bad_group.stderr
    port = processes.free_port()
    down = subprocess.run(
        [sys.executable, "-m", "examples.analysis", "--out", str(tmp_path / "o"), "--connection-string",
         processes.azurite_connection_string(port, port, port)],
        cwd=processes.REPO, capture_output=True, text=True, timeout=120)
    assert down.returncode == 3
    assert down.stderr.startswith("error: could not read the capture files")
    assert "Traceback" not in down.stderr
    assert len(down.stderr.strip().splitlines()) == 1
