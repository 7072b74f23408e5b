"""Recorded history for what-if replays (central.cli.whatif): the events and VMs as they were, read from the
log store's State table, or folded from exported envelopes (a Capture or consumer export, JSON lines).

Both give `PastEvent`s (facts as first reported; when each was really approved, started, ended) and the
VMs by name. The envelope fold is pure; the store read is the only I/O here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from central.model.envelope import APPROVAL_RESULT, INCARNATION
from central.model.events import EventRecord
from central.model.times import aware, parse
from central.model.vms import VmState
from central.policy.decide import DONE_OUTCOMES, REFUSED_OUTCOMES
from central.store.log_rows import vm_decider

from .whatif import PastEvent

History = Tuple[List[PastEvent], Dict[str, VmState]]


class HistoryError(ValueError):
    """The history cannot be read; the message says where and why."""


# ---- the log store (State table) -------------------------------------------------------------------

def from_store(service: Any, table_prefix: str, since: datetime) -> History:
    """Every event first seen at or after `since` (open or ended), and every VM, from <prefix>State.
    `service`: an azure.data.tables TableServiceClient (Azurite, or an account with Entra ID auth)."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    from central.store import state_rows as rows

    try:
        client = service.get_table_client(table_prefix + "State")
        events = client.query_entities("Kind eq 'event' and FirstSeen ge @since", parameters={"since": since})
        past = [past_from_record(rows.event_from_entity(dict(e))) for e in events]
        found = (rows.vm_from_entity(dict(e)) for e in client.query_entities("Kind eq 'vm'"))
        vms = {vm.name: vm for vm in found}
    except ResourceNotFoundError:
        raise HistoryError(f"no table {table_prefix}State in this account: give --table-prefix, the Function "
                           "app's TABLE_PREFIX (az functionapp config appsettings list -g RG -n APP "
                           "--query \"[?name=='TABLE_PREFIX'].value\" -o tsv)") from None
    except AzureError as exc:
        raise HistoryError(f"cannot read the log store: {type(exc).__name__}: {str(exc)[:300]}") from None
    return past, vms


def past_from_record(rec: EventRecord) -> PastEvent:
    """What central recorded about an event -> when it was approved (the first approval that its VM
    carried out, or a local approval), started and ended. Only an `approved` outcome is an approval: the
    forwarder's end-of-event report (rec.ending) and a refused attempt are not."""
    approved_at: Optional[datetime] = None
    approved_by = ""
    for attempt in rec.approvals:
        if attempt.result in DONE_OUTCOMES:
            approved_at, approved_by = attempt.sent_at, attempt.decided_by
            break
    if approved_at is None and rec.outcome in DONE_OUTCOMES and rec.outcome_at is not None:
        approved_at, approved_by = rec.outcome_at, f"vm:{rec.outcome_vm or '?'}"
    refused = next((a for a in rec.approvals if a.result in REFUSED_OUTCOMES), None)
    started = next((parse(h["at"]) for h in rec.history if h.get("status") == "Started"), None)
    return PastEvent(rec, approved_at, approved_by, started, rec.ended_at,
                     refused.sent_at if refused else None, str(refused.result) if refused else "")


# ---- exported envelopes ----------------------------------------------------------------------------

def envelope_lines(lines: Iterable[str]) -> List[Tuple[Dict[str, Any], datetime]]:
    """JSON lines -> (envelope, central's time for it), sorted by that time. A line is an envelope, or a
    record with the envelope in "body" (object or JSON text) and the hub's "enqueuedTime" (a consumer or
    Capture export); without one, the envelope's own `time`. Raises HistoryError on a line that is
    neither, naming its number."""
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            body = doc.get("body", doc) if isinstance(doc, dict) else None
            if isinstance(body, str):
                body = json.loads(body)
            if not isinstance(body, dict) or "type" not in body or "data" not in body:
                raise ValueError("not an envelope (no type and data)")
            at = parse(doc.get("enqueuedTime")) if isinstance(doc.get("enqueuedTime"), str) else None
            at = at or parse(body.get("time"))
            if at is None:
                raise ValueError("no time")
        except (ValueError, AttributeError) as exc:
            raise HistoryError(f"line {number}: {exc}") from None
        out.append((body, aware(at)))
    return sorted(out, key=lambda pair: (pair[1], str(pair[0].get("id"))))


def fold(envelopes: Iterable[Tuple[Dict[str, Any], datetime]]) -> History:
    """Replay envelopes as central ingests them (each VM's documents in order; an event ends when every VM
    that listed it stops listing it) into the history of each event. Pure."""
    records: Dict[str, EventRecord] = {}
    started: Dict[str, datetime] = {}
    approved: Dict[str, Tuple[datetime, str]] = {}
    refused: Dict[str, Tuple[datetime, str]] = {}  # an approval refused on its VM: when, and how
    listed: Dict[str, List[str]] = {}  # vmId -> EventIds its latest document lists
    incarnations: Dict[str, int] = {}
    vms: Dict[str, VmState] = {}
    for env, at in envelopes:
        data = env.get("data") or {}
        vm_doc = data.get("vm") or {}
        vm_id, name = str(vm_doc.get("vmId") or ""), str(vm_doc.get("name") or env.get("subject") or "")
        if not vm_id or not name:
            continue
        if name not in vms:
            vms[name] = VmState(vm_id, name)
            vms[name].bind_identity(vm_doc)
        kind = env.get("type")
        if kind == INCARNATION:
            inc = data.get("incarnation")
            if isinstance(inc, int) and inc <= incarnations.get(vm_id, -1) and not data.get("reset"):
                continue  # older or repeated: central ignores it too
            incarnations[vm_id] = inc if isinstance(inc, int) else incarnations.get(vm_id, -1)
            _apply_document(data.get("document") or {}, vm_id, name, at, records, started, listed)
        elif kind == APPROVAL_RESULT and data.get("outcome") in DONE_OUTCOMES:
            # the VM's word, recorded as one (an export holds no record of what central sent)
            approved.setdefault(str(data.get("eventId")), (at, vm_decider(name, data.get("decidedBy"))))
        elif kind == APPROVAL_RESULT and data.get("outcome") in REFUSED_OUTCOMES:
            refused.setdefault(str(data.get("eventId")), (at, str(data["outcome"])))
        # completed / post-hook-failed: the forwarder's end-of-event report, never an approval
    past = []
    for event_id, rec in records.items():
        at, by = approved.get(event_id, (None, ""))
        sent, how = refused.get(event_id, (None, ""))
        past.append(PastEvent(rec, at, by, started.get(event_id), rec.ended_at, sent, how))
    return past, vms


def _apply_document(doc: Mapping[str, Any], vm_id: str, name: str, at: datetime,
                    records: Dict[str, EventRecord], started: Dict[str, datetime],
                    listed: Dict[str, List[str]]) -> None:
    now_listed = []
    for event in doc.get("Events") or []:
        event_id = str(event.get("EventId") or "")
        if not event_id or name not in (event.get("Resources") or []):
            continue  # a sibling's event: the VMs it names report it (central.intake.authz)
        rec = records.get(event_id)
        if rec is None:
            rec = records[event_id] = EventRecord(event_id=event_id, first_seen=at)
        if rec.ended:
            continue
        rec.absorb(event, vm_id, name, at)
        if rec.status == "Started":
            started.setdefault(event_id, at)
        now_listed.append(event_id)
    for event_id in listed.get(vm_id, []):
        rec = records.get(event_id)
        if event_id not in now_listed and rec is not None:
            rec.unlisted_by(vm_id, at)
    listed[vm_id] = now_listed
