"""The production function app (function_app.py) with a probe for bench.central_soak: every
SOAK_PROBE_SECONDS it writes the sizes of the central service's in-memory caches to the file named by
SOAK_PROBE_FILE, so a soak can see from outside whether any of them only grows.

Run by the sandbox Functions runner as `--app bench.soak_probe`; the functions are function_app's own (its
one FunctionApp re-exported), nothing is changed in them. The probe reads lengths only (a racing resize
at worst gives a figure one batch old); it never takes the service's lock, so it cannot slow ingest.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, Optional

import function_app
from function_app import app  # noqa: F401 - the runner finds the one FunctionApp in this module's names

PROBE_FILE = "SOAK_PROBE_FILE"
PROBE_SECONDS = "SOAK_PROBE_SECONDS"


def _size(value: Any) -> Optional[int]:
    try:
        return len(value)
    except TypeError:
        return None


def sizes(service: Any) -> Dict[str, Optional[int]]:
    """Each in-memory structure of a CentralService that a long run could grow (None: not there)."""
    state, ingest = service.state, service.ingest
    active = state.active
    return {
        "seen_ids": _size(getattr(service, "_seen", None)),
        "raised_keys": _size(getattr(ingest, "raised", None)),
        "cached_vms": _size(state.vms),
        "cached_active": _size(active),
        "active_reporters": _size(getattr(active, "reporters", None)),
        "active_owing": _size(getattr(active, "owing", None)),
        "active_changed": _size(getattr(active, "_changed", None)),
        "cached_ended": _size(state.ended),
        "cached_names": _size(state.names),
        "cached_named": _size(state.named),
        "alert_etags": _size(state.alert_etags),
        "deferred": _size(getattr(state, "_deferred", None)),
        "deferred_by_tag": _size(getattr(state, "_deferred_by_tag", None)),
        "head_log_chars": _size(state.head_log or ""),
        "head_vms_chars": _size(state.head_vms or ""),
        "recent_groups": _size(getattr(ingest.recent_groups, "seen", None)),
    }


def _loop(path: str, every: float) -> None:
    while True:
        time.sleep(every)
        service = function_app._service
        if service is None:  # built on the first invocation
            continue
        try:
            record = {"t": time.time(), **sizes(service)}
        except Exception as exc:  # noqa: BLE001 - a probe never stops the app; the soak sees the error
            record = {"t": time.time(), "error": repr(exc)}
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(record, out)
        os.replace(tmp, path)  # the soak reads a whole file


if os.environ.get(PROBE_FILE):
    threading.Thread(
        target=_loop,
        args=(os.environ[PROBE_FILE], float(os.environ.get(PROBE_SECONDS, "10"))),
        name="soak-probe",
        daemon=True,
    ).start()
