"""Store faults injected at the store's boundary, for tests of what central does when Table storage refuses
content (HTTP 400) that Azurite itself accepts: the SDK and Azurite run as always underneath."""

from __future__ import annotations

from typing import Any, Dict


def refusing_store(svc: Any, marker: str) -> Dict[str, bool]:
    """Fault injection at the store's boundary (Azurite accepts what these bodies hold): while `on`, the
    service refuses (HTTP 400, Rejected) any State transaction that mentions `marker` or writes a
    `quarantined` alert; with `everything`, every State transaction."""
    import json as json_mod

    from central.store.tables import Rejected

    real, switch = svc.store.transact, {"on": True, "everything": False}

    def transact(table: str, ops: list) -> list:
        text = json_mod.dumps([op.entity for op in ops], default=str)
        if switch["on"] and table == "State" and (
                switch["everything"] or marker in text or "quarantined:" in text):  # a quarantine alert
            raise Rejected(0, "the service refuses this content")
        return real(table, ops)

    svc.store.transact = transact
    return switch
