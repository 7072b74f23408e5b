"""Re-verifying the envelopes kept for a trust failure, once trust is repaired (pure: no I/O here).

An envelope whose signer central could not chain to a trusted root (a CA change: docs/security.md, "When
Azure changes its CA") is kept whole in the Quarantine table with what re-verifying it needs: its body,
its five `se-auth*` properties and `EnqueuedAt`, the time central received it. `plan` takes those kept
rows and the current verifier, and re-checks each AS OF ITS RECEIVE TIME (the attested document and the
certificates are judged as they were then, never as of today, so a document that expired since still
counts for what it said while current). Each row becomes one step:
- verified: its envelope is applied through the normal ingest path as if it had arrived then (a report
  that a newer incarnation superseded is recorded, not acted on: ingest's own ordering does that);
- refused: the repaired trust reveals another reason (a forgery the chain failure hid, a bad body): it is
  quarantined and alerted for that reason, never applied;
- untrusted: still a trust failure: the row stays kept for the next try;
- duplicate: the same body as an earlier row of this plan (kept twice on two days): nothing to apply;
- unreadable: the row lost what re-verifying needs (a body or properties cut by the store): kept as is.
Steps come oldest first (by receive time), so one VM's reports are applied in the order it sent them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from central.model.alert import Alert
from central.model.envelope import BadEnvelope, Envelope
from central.model.times import iso

from .plan import Item

MAX_PER_RUN = 2000  # rows applied per run (the oldest first); the rest wait for the next run
# rows checked per run: rows that stay untrusted (anyone with the hub's send right can make such rows, with
# a self-made chain under an unknown issuer) must not keep the ones that verify from being reached
MAX_CHECKED = 20_000

# verify(body, received, properties) -> the Item ingest would have made of it at `received`, checked by
# the current trust (central.runtime.ingest.parse with the sender gate)
Verify = Callable[[str, datetime, Dict[str, str]], Item]


@dataclass(frozen=True)
class Held:
    """One kept trust-refused Quarantine row (central.store.held reads them)."""

    partition: str
    row: str
    etag: str
    body: Optional[str]                 # None: unreadable
    properties: Optional[Dict[str, str]]
    enqueued: datetime                  # when central received it: the time it is verified and applied as of
    issuer: str = ""


@dataclass(frozen=True)
class Step:
    held: Held
    outcome: str           # verified | refused | untrusted | duplicate | unreadable
    item: Optional[Item]   # what to apply (verified, refused); None otherwise
    reason: str = ""       # for untrusted / refused: why, as the verifier says
    issuer: str = ""       # for untrusted: the issuer that still cannot be chained

    @property
    def applies(self) -> bool:
        return self.item is not None


def plan(held: Sequence[Held], verify: Verify, limit: int = MAX_PER_RUN,
         checked: int = MAX_CHECKED) -> List[Step]:
    """Kept rows re-verified as of their receive time, oldest first, until `limit` of them apply (or
    `checked` rows were looked at)."""
    steps: List[Step] = []
    bodies: Set[str] = set()
    applying = 0
    for h in sorted(held, key=lambda x: (x.enqueued, x.partition, x.row))[:max(0, checked)]:
        if applying >= limit:
            break
        if h.body is None or h.properties is None:
            steps.append(Step(h, "unreadable", None, "the kept row lost its body or properties"))
            continue
        digest = hashlib.sha256(h.body.encode("utf-8", "surrogatepass")).hexdigest()
        if digest in bodies:
            steps.append(Step(h, "duplicate", None, "the same body as an earlier kept row"))
            continue
        bodies.add(digest)
        item = verify(h.body, h.enqueued, h.properties)
        item.received = h.enqueued  # as if it arrived then, whatever the verifier set
        parsed = item.parsed
        if isinstance(parsed, Envelope):
            steps.append(Step(h, "verified", item))
            applying += 1
        elif isinstance(parsed, BadEnvelope) and "trustIssuer" in parsed.extra:
            issuer = str(parsed.extra.get("trustIssuer") or "")
            steps.append(Step(h, "untrusted", None, _first(parsed), issuer))
        else:
            steps.append(Step(h, "refused", item, _first(parsed)))
            applying += 1
    return steps


def summary(held: Sequence[Held]) -> Dict[str, object]:
    """What /api/health and `se-fleet status` show: how many envelopes are held for trust, the oldest's
    receive time, and the issuers (at most 10, the most frequent first)."""
    issuers: Dict[str, int] = {}
    for h in held:
        issuers[h.issuer or "?"] = issuers.get(h.issuer or "?", 0) + 1
    oldest = min((h.enqueued for h in held), default=None)
    return {"count": len(held), "oldest": iso(oldest) if oldest else None,
            "issuers": [i for i, _ in sorted(issuers.items(), key=lambda kv: (-kv[1], kv[0]))[:10]]}


def vm_of(row: Mapping[str, Any]) -> str:
    """A kept row's VM: the vmId its sender claimed (a refused envelope's name is not recorded), else
    its name."""
    return str(row.get("VmId") or row.get("VmName") or "(no VM)")


def by_vm(rows: Sequence[Mapping[str, Any]]) -> List[Tuple[str, int]]:
    """(VM, count) of rows, the most first."""
    counts: Dict[str, int] = {}
    for row in rows:
        vm = vm_of(row)
        counts[vm] = counts.get(vm, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _vm_counts(rows: Sequence[Mapping[str, Any]], most: int = 20) -> List[Dict[str, object]]:
    return [{"vm": vm, "count": n} for vm, n in by_vm(rows)[:most]]


def given_up_summary(rows: Sequence[Mapping[str, Any]]) -> Dict[str, object]:
    """Health's record of the kept rows given up past the keep window: how many, of which VMs (at most 20),
    when last."""
    last = max((r["ReverifiedAt"] for r in rows if isinstance(r.get("ReverifiedAt"), datetime)), default=None)
    return {"count": len(rows), "vms": _vm_counts(rows), "last": iso(last) if last else None}


def given_up_alert(rows: Sequence[Mapping[str, Any]], days: int, now: datetime) -> Alert:
    """One critical alert for the rows this sweep gave up (the caller marked them done under their ETags, so
    two instances never alert on the same row): how many envelopes of which VMs, and what to do."""
    vms = by_vm(rows)
    named = ", ".join(f"{vm} ({n})" for vm, n in vms[:20]) + (" and others" if len(vms) > 20 else "")
    keys = sorted(f"{r['PartitionKey']}/{r['RowKey']}" for r in rows)
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
    oldest = min((str(r["PartitionKey"]) for r in rows), default="")
    return Alert(
        f"held-given-up:{digest}", "held-given-up", "critical",
        f"{len(rows)} envelope(s) kept for a trust failure were given up unverified",
        f"{len(rows)} envelope(s) refused for a trust failure stayed unverifiable for more than "
        f"AUTHN_HELD_DAYS ({days} days) and were given up: never applied. VMs: {named}. They stay in the "
        f"Quarantine table (Reverified = given-up, oldest day {oldest}); what they reported is lost to "
        "central's decisions. "
        "Repair the trust (docs/security.md, the CA-change runbook) so newer envelopes verify.",
        now, facts={"count": len(rows), "vms": _vm_counts(rows), "days": days, "oldestDay": oldest})


def _first(bad: object) -> str:
    errors = getattr(bad, "errors", None) or [{"message": "?"}]
    return str(errors[0].get("message", "?"))[:300]
