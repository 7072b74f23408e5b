"""Downgrade protection (AUTHN_MODE=preferred): PURE decisions on one envelope and its VM's State row.

The sender gate (central.intake.sender) says how an accepted envelope got in: `signed` True (its
signature and attested document verified), False (unsigned, let through by `preferred` on condition),
None (authentication off: nothing is known). Whether the VM has signed before is the VM row's
`SignedAt` in the State table, not any instance's memory: planning reads it from the row it commits
under If-Match, so an instance that cached the row before another instance recorded SignedAt loses the
commit race, re-reads the row and refuses. A VM that signed once is never accepted unsigned again, on
any instance, after any restart, at no Storage round trip beyond the VM row ingest writes anyway.
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional

REASON = "downgrade"


def refusal(signed: Optional[bool], signed_at: Optional[datetime], vm_id: str) -> str:
    """'' to go on; else why this unsigned envelope is refused (its VM has signed before)."""
    if signed is False and signed_at is not None:
        return (f"sender not authenticated ({REASON}): unsigned, but VM {vm_id[:64]} has signed since "
                f"{signed_at.isoformat()}: a VM that signed cannot be downgraded")
    return ""


def signed_since(signed: Optional[bool], signed_at: Optional[datetime],
                 received: datetime) -> Optional[datetime]:
    """The VM row's SignedAt after an accepted envelope received at `received`: the first signed one's."""
    if signed and (signed_at is None or received < signed_at):
        return received
    return signed_at
