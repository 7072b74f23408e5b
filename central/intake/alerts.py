"""The alerts ingest raises, built as plain values (pure): quarantined envelopes, refused reports,
outbox drops, and the status alert an event owes. Ingest commits them with the changes that cause them;
central.runtime.act delivers them (at least once, with a stable idempotency key).

Quarantine and refusal alerts are bounded per source: one per sending VM as central verified it (one
for every body whose sender is not verified, whatever VM it claims; one for bodies that name none)
per WINDOW, whatever the volume; every body is still kept in the Quarantine table. So a flood from one
VM costs one alert per window, and an unverified body can never crowd out a verified VM's alerts."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Dict, List

from central.model.alert import ALERT_LEASE, Alert
from central.model.envelope import BadEnvelope, Envelope
from central.model.events import EventRecord
from central.model.times import iso
from central.model.vms import VmState

WINDOW_SECONDS = 600


def window(now: datetime) -> str:
    """The alert window `now` falls in (its start), part of a bounded alert's key."""
    start = int(now.timestamp()) // WINDOW_SECONDS * WINDOW_SECONDS
    return iso(datetime.fromtimestamp(start, now.tzinfo))


def quarantined(bad: BadEnvelope, now: datetime) -> Alert:
    """Keyed by the VM only when central verified the sender: an unverified body that claims a VM shares
    the one `unverified` key of its window, so it can never take that VM's own alert's key (issue 22)."""
    first = bad.errors[0] if bad.errors else {"path": "/", "message": "?"}
    source = bad.vm_id if bad.verified and bad.vm_id else ("unverified" if bad.vm_id else "unattributed")
    return Alert(
        f"quarantined:{source}:{window(now)}",
        "quarantined",
        "warning",
        "Central quarantined an envelope it could not accept",
        f"{first['path']}: {first['message']} (the first in this {WINDOW_SECONDS // 60}-minute window; "
        "every one is kept in the Quarantine table)",
        now,
        facts={
            "vmId" if bad.verified else "claimedVmId": bad.vm_id, "envelopeId": bad.envelope_id,
            "sha256": bad.sha256, "errors": len(bad.errors),
        },
        next_try=now + ALERT_LEASE,
    )


def trust_failure(bad: BadEnvelope, now: datetime) -> Alert:
    """Sender authentication could not chain a signer to a trusted root: most likely Azure moved to a CA
    central neither ships nor could fetch. One critical alert per issuer per day, whatever the volume."""
    issuer = str(bad.extra.get("trustIssuer") or "an unknown issuer")
    return Alert(
        f"authn-trust:{issuer[:120]}:{iso(now)[:10]}",
        "authn-trust",
        "critical",
        f"Sender authentication cannot chain attested documents through {issuer}",
        f"Envelopes signed under {issuer} are refused as untrusted and kept in the Quarantine table with "
        "their authentication properties. Diagnose one document from an affected VM with `se-attest "
        "doc.json`, then add the issuer to AUTHN_TRUST_PEM or allow its AIA host in AUTHN_AIA_HOSTS "
        "(docs/security.md, 'When Azure changes its CA').",
        now,
        facts={"issuer": issuer, "claimedVmId": bad.vm_id, "sha256": bad.sha256},
        next_try=now + ALERT_LEASE,
    )


def downgrade(bad: BadEnvelope, now: datetime) -> Alert:
    """An unsigned envelope claiming a VM that has signed before (AUTHN_MODE=preferred): a forwarder rolled
    back, or someone with the hub's send right speaking for that VM. One alert per window for all of
    them, keyed by no VM (the claim is not verified, issue 22 point 7); the body is in Quarantine."""
    return Alert(
        f"authn-downgrade:{window(now)}",
        "authn-downgrade",
        "critical",
        "Central refused an unsigned envelope from a VM that has signed before",
        f"An envelope claiming VM {str(bad.vm_id)[:64]} came without sender authentication, but that VM has "
        "signed before: it is refused (not verified: the claim may be forged). If its forwarder was rolled "
        f"back, upgrade it again (the first in this {WINDOW_SECONDS // 60}-minute window; every one is kept "
        "in the Quarantine table).",
        now,
        facts={"claimedVmId": bad.vm_id, "envelopeId": bad.envelope_id, "sha256": bad.sha256},
        next_try=now + ALERT_LEASE,
    )


def forwarder_quarantined(env: Envelope, sha256: str, now: datetime) -> Alert:
    errs = env.data.get("errors") or [{"path": "/", "message": "?"}]
    return Alert(
        f"quarantined:{env.vm_id}:{window(now)}",
        "quarantined",
        "warning",
        f"IMDS on {env.vm_name} returned a document that fails the schema",
        f"{errs[0]['path']}: {errs[0]['message']}",
        now,
        facts={"vm": env.vm_name, "vmId": env.vm_id, "errors": len(errs)},
        next_try=now + ALERT_LEASE,
    )


def refused(env: Envelope, problems: List[Dict[str, str]], sha256: str, now: datetime) -> Alert:
    """A VM said something it may not (issue 14, item 1): what it said is kept in Quarantine."""
    first = problems[0]
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return Alert(
        f"refused:{env.vm_id}:{window(now)}",
        "refused-report",
        "warning",
        f"Central refused part of a report from {env.vm_name}",
        f"{first['path']}: {first['message']}{more}",
        now,
        facts={"vm": env.vm_name, "vmId": env.vm_id, "envelopeId": env.id, "problems": len(problems)},
        next_try=now + ALERT_LEASE,
    )


def outbox_dropped(vm: VmState, dropped: int, outbox: Dict[str, Any], now: datetime) -> Alert:
    return Alert(
        f"outbox-dropped:{vm.vm_id}:{dropped}",
        "outbox-dropped",
        "critical",
        f"Forwarder on {vm.name} dropped envelopes",
        f"The bounded outbox on {vm.name} dropped {dropped - vm.outbox_dropped} envelope(s) "
        f"({dropped} since install): Event Hubs was unreachable for long. Incarnations may be missing.",
        now,
        facts={
            "vm": vm.name,
            "vmId": vm.vm_id,
            "dropped": dropped,
            "previously": vm.outbox_dropped,
            "lastError": outbox.get("lastError"),
        },
        next_try=now + ALERT_LEASE,
    )


def owe_status_alert(rec: EventRecord, now: datetime) -> str:
    """The event owes one alert for its new status (built at delivery, so it carries the decision)."""
    key = f"{rec.event_id}:{rec.status}"
    if any(a.get("key") == key for a in rec.pending_alerts):
        return key
    alert = Alert(key, "event-status", "", "", "", now, rec.event_id, rec.status, next_try=now + ALERT_LEASE)
    rec.pending_alerts.append(alert.to_json())
    return key
