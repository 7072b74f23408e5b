"""`se-forwarder check`: does everything `run` needs work? One line per check: ok, warn or fail.

Exit 0 only when `run` would work (warnings allowed); otherwise the first failure's code (cli.py):
3/4/5 IMDS, 6 state directory, 9 another service `run` needs (Event Hubs, approval queue, managed
identity, hooks, clock, the schema check's child process). The configuration itself was checked before
(exit 2). Nothing is published, nothing in the state directory is changed: the outbox and ledger are
only read.
"""

from __future__ import annotations

import email.utils
import json
import os
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from . import exitcodes, validation
from .config import Config

OK, WARN, FAIL = "ok", "warn", "fail"
CLOCK_WARN, CLOCK_FAIL = 30.0, 300.0  # seconds; 300 = the skew an approval message tolerates
PROBE_TIMEOUT = 30.0


@dataclass
class Line:
    name: str
    status: str
    detail: str
    code: int = 0  # the exit code of a failure

    def text(self) -> str:
        return f"{self.status:<4}  {self.name:<9} {self.detail}"


@dataclass
class Report:
    lines: List[Line] = field(default_factory=list)
    data: Dict[str, Any] = field(default_factory=dict)  # the --json report's other keys

    def add(self, name: str, status: str, detail: str, code: int = exitcodes.CHECK_FAILED) -> None:
        self.lines.append(Line(name, status, detail, code if status == FAIL else 0))

    @property
    def exit_code(self) -> int:
        return next((line.code for line in self.lines if line.status == FAIL), 0)


def check(config: Config, as_json: bool = False) -> int:
    import logging

    logging.getLogger("forwarder").setLevel(max(logging.WARNING, logging.getLogger("forwarder").level))
    report = Report()
    source = "defaults" if config.source("config") == "default" and not Path(config.config).exists() \
        else config.config
    report.add("config", OK, f"valid ({source})")
    _state(config, report)
    vm = _imds(config, report)
    credentials = _identity(config, report)
    _sink(config, report, credentials.get("sink"))
    _queue(config, report, vm, credentials.get("queue"))
    _hooks(config, report)
    report.data["exitCode"] = report.exit_code
    if as_json:
        out = {**report.data, "checks": [asdict(line) for line in report.lines]}
        print(json.dumps(out, indent=2, default=str))
    else:
        for line in report.lines:
            print(line.text())
    return report.exit_code


# ---- state directory -------------------------------------------------------------------------------

def _writable_dir(path: Path) -> Optional[str]:
    """Why `run` could not write in `path` (None: it can), creating nothing."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return f"no existing parent of {path}"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user (uid {os.geteuid() if hasattr(os, 'geteuid') else '?'})"
    return None


def _state(config: Config, report: Report) -> None:
    from .outbox import DB_NAME, set_aside_files

    state = Path(config.state_dir)
    problem = _writable_dir(state)
    if problem:
        report.add("state", FAIL, f"{state}: {problem}; run would exit 6", exitcodes.STATE)
        return
    db = state / DB_NAME
    report.add("state", OK, f"{state} writable" if state.exists() else f"{state} can be created")
    if not db.exists():
        report.add("outbox", OK, "none yet (run creates it)")
        report.data["outbox"] = {"path": str(db), "exists": False}
    else:
        outbox = _read_outbox(db)
        report.data["outbox"] = outbox
        if "error" in outbox:
            report.add("outbox", WARN, f"{db} is unreadable ({outbox['error']}): run will set it aside "
                       "and start a fresh one")
        else:
            status = WARN if outbox["lastError"] else OK
            report.add("outbox", status, f"{db}: backlog {outbox['backlog']}, dropped {outbox['dropped']}, "
                       f"last send {outbox['lastSendAt'] or 'never'}"
                       + (f", last error: {outbox['lastError']}" if outbox["lastError"] else ""))
    aside = set_aside_files(state)
    if aside:
        report.add("outbox", WARN, f"{len(aside)} corrupt outbox(es) set aside, kept for inspection: "
                   + ", ".join(p.name for p in aside[-3:]))


def _read_outbox(db: Path) -> Dict[str, Any]:
    """The outbox's figures, read-only (a running daemon may hold it; nothing is changed)."""
    from .clock import iso

    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            backlog = int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
            state = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM state")}
        finally:
            conn.close()
    except (sqlite3.Error, ValueError) as exc:
        return {"path": str(db), "error": str(exc)}
    last_send, error_at = state.get("last_send_at"), state.get("last_error_at")
    return {"path": str(db), "backlog": backlog, "dropped": int(state.get("dropped") or 0),
            "lastSendAt": iso(last_send) if last_send else None, "lastError": state.get("last_error"),
            "lastErrorAt": iso(error_at) if error_at else None, "setAside": state.get("set_aside"),
            "lastIncarnation": state.get("last_incarnation")}


# ---- IMDS --------------------------------------------------------------------------------------------

def _imds(config: Config, report: Report) -> Optional[Any]:
    from .identity import IdentityError, from_compute
    from .imds import ImdsClient, ImdsRejected, ImdsUnavailable
    from .poller import parse

    report.data["imds"] = {"url": config.imds_url, "apiVersion": config.api_version}
    client = ImdsClient(config.imds_url, config.api_version, retry_seconds=3.0)
    vm = None
    try:
        vm = from_compute(client.get_compute())
        report.data["identity"] = vm.as_vm()
        report.add("identity", OK, f"VM {vm.name} ({vm.vm_id})")
        response = client.get_scheduled_events()
        report.data["imds"]["answered"] = True
        try:
            validation.use_child_process()  # checked as `run` checks it: in a child process
            parsed = parse(response.text)
        except validation.ValidationUnavailable as exc:
            report.add("imds", FAIL, f"{exc}: run could check no IMDS document or approval message",
                       exitcodes.CHECK_FAILED)
            return vm
        finally:
            validation.use_child_process(False)
        report.data["document"] = {"valid": not parsed.errors, "incarnation": parsed.incarnation,
                                   "errors": parsed.errors, "events": _event_summary(parsed.document)}
        if parsed.errors:
            first = parsed.errors[0]
            report.add("imds", FAIL, f"document invalid at {first['path']}: {first['message']} (run would "
                       "quarantine it)", exitcodes.INVALID_DOCUMENT)
        else:
            events = report.data["document"]["events"] or []
            report.add("imds", OK, f"{config.imds_url} answered; incarnation {parsed.incarnation}, "
                       f"{len(events)} event(s); ETag {'yes' if response.headers.get('ETag') else 'no'}")
        _clock(response.headers.get("Date"), report)
    except ImdsUnavailable as exc:
        report.data["imds"].update(answered=False, error=str(exc))
        report.add("imds", FAIL, str(exc), exitcodes.IMDS_UNAVAILABLE)
    except (ImdsRejected, IdentityError) as exc:
        report.data["imds"].update(answered=True, error=str(exc))
        report.add("imds", FAIL, str(exc), exitcodes.IMDS_REJECTED)
    finally:
        client.close()
    return vm


def _clock(date: Optional[str], report: Report) -> None:
    """This VM's clock against IMDS's (the Date header): approvals compare times with central's."""
    if not date:
        report.add("clock", WARN, "IMDS sent no Date header: cannot compare clocks")
        return
    try:
        theirs = email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        report.add("clock", WARN, f"IMDS's Date header {date!r} does not parse")
        return
    skew = time.time() - theirs
    detail = f"{skew:+.0f} s against IMDS"
    if abs(skew) > CLOCK_FAIL:
        report.add("clock", FAIL, f"{detail}: approvals would be refused as stale or from the future; fix "
                   "time sync (chrony/systemd-timesyncd, or w32time)")
    elif abs(skew) > CLOCK_WARN:
        report.add("clock", WARN, f"{detail}: check time sync")
    else:
        report.add("clock", OK, detail)


# ---- the services run needs ---------------------------------------------------------------------

def _bounded(what: Callable[[], Any], timeout: float = PROBE_TIMEOUT) -> Any:
    """`what()` on a thread, at most `timeout` seconds (an SDK may block on a peer that never answers)."""
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = what()
        except Exception as exc:  # noqa: BLE001 - reported by the caller as one line
            outcome["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _identity(config: Config, report: Report) -> Dict[str, Any]:
    """The managed identities `run` will use: a token from each for the resource it serves. The hub's is
    `client_id`; the approval queue's is `queue_client_id` (the VM's own, docs/deploy.md)."""
    needs = []
    if config.sink == "eventhub" and not config.eventhub_connection_string:
        needs.append(("sink", config.client_id, "https://eventhubs.azure.net/.default"))
    if config.queue_service_uri:
        needs.append(("queue", config.queue_client_id, "https://storage.azure.com/.default"))
    if not needs:
        return {}
    from .imds import managed_identity_credential
    from .ratelimit import RateLimiter

    limiter = RateLimiter()
    made: Dict[str, Any] = {}
    found: Dict[str, Any] = {}
    for use, client_id, scope in needs:
        credential = made.get(client_id) or managed_identity_credential(client_id, limiter)
        made[client_id] = found[use] = credential
        which = f"user-assigned {client_id}" if client_id else "system-assigned"
        try:
            _bounded(lambda c=credential, s=scope: c.get_token(s))
            report.add("identity", OK, f"managed identity ({which}): token for {scope}")
        except Exception as exc:  # noqa: BLE001 - one line per failure
            report.add("identity", FAIL,
                       f"managed identity ({which}) has no token for {scope}: {_one_line(exc)}")
    return found


def _sink(config: Config, report: Report, credential: Any) -> None:
    report.data["sink"] = _sink_summary(config)
    if config.sink == "stdout":
        report.add("sink", OK, "stdout")
        return
    if config.sink == "file":
        problem = _writable_dir(config.sink_path.parent)
        if not problem and config.sink_path.is_dir():  # (run would retry its sends forever)
            problem = "is a directory: name a file in it"
        if problem:
            report.add("sink", FAIL, f"file {config.sink_path}: {problem}")
        else:
            report.add("sink", OK, f"file {config.sink_path} (a local file: nothing leaves this VM)")
        return
    from . import sinks
    from .ratelimit import RateLimiter

    target = report.data["sink"]["target"]
    try:
        sink = sinks.make(config, RateLimiter(), (lambda: credential) if credential is not None else None)
    except Exception as exc:  # noqa: BLE001
        report.add("sink", FAIL, f"Event Hubs {target}: {_one_line(exc)}")
        return
    try:
        size = _bounded(sink.probe)
        report.add("sink", OK, f"Event Hubs {target}: sender link opened ({report.data['sink']['auth']}; "
                   f"events up to {size} bytes); nothing sent")
    except Exception as exc:  # noqa: BLE001
        report.add("sink", FAIL, f"Event Hubs {target}: cannot open a sender link: {_one_line(exc)}")
    finally:
        sink.close()


def _sink_summary(config: Config) -> Dict[str, Any]:
    """Where `run` would publish (no secret: a connection string shows only its endpoint)."""
    if config.sink != "eventhub":
        return {"name": config.sink, "path": str(config.sink_path) if config.sink == "file" else None}
    from .sinks.eventhub import EventHubSettings

    settings = EventHubSettings(namespace=config.eventhub_namespace, eventhub_name=config.eventhub_name,
                                connection_string=config.eventhub_connection_string)
    auth = "connection string" if config.eventhub_connection_string else "managed identity"
    return {"name": "eventhub", "target": settings.target, "auth": auth}


def _queue(config: Config, report: Report, vm: Any, credential: Any) -> None:
    if not (config.queue_service_uri or config.queue_connection_string):
        report.add("approvals", OK, "no approval queue configured: central approvals off (the fast path "
                   "and post-event hooks still run)")
        return
    if vm is None:
        report.add("approvals", WARN, "approval queue not checked: the VM identity (IMDS) is unknown")
        return
    from .approvals import naming, queue

    name = naming.queue_name(vm.vm_id)
    try:
        client = queue.queue_client(name, config.queue_service_uri or None,
                                    config.queue_connection_string or None, credential)
    except Exception as exc:  # noqa: BLE001
        report.add("approvals", FAIL, f"queue {name}: {_one_line(exc)}")
        return
    try:
        # A peek changes nothing (no dequeue count, no visibility) and needs only what `run` needs.
        _bounded(lambda: list(client.peek_messages(max_messages=1)))
        report.add("approvals", OK, f"queue {name} readable")
    except queue.errors()[1]:
        report.add("approvals", WARN, f"queue {name} does not exist yet (central creates it with its first "
                   "approval for this VM)")
    except Exception as exc:  # noqa: BLE001
        report.add("approvals", FAIL, f"queue {name}: {_one_line(exc)}")
    finally:
        client.close()


def _hooks(config: Config, report: Report) -> None:
    from . import hooks
    from .app import hook_settings

    settings = hook_settings(config)
    for phase in hooks.PHASES:
        found = hooks.survey(phase, settings)
        where = found.directory
        if found.unsafe:
            report.add("hooks", FAIL, f"{phase}: refused, {found.unsafe}")
            continue
        for name, why in found.refused:
            report.add("hooks", FAIL, f"{phase}: {name} would be refused: {why}")
        extra = "".join([f"; not executable (skipped): {', '.join(found.skipped)}" if found.skipped else "",
                         f"; examples (never run): {', '.join(found.examples)}" if found.examples else ""])
        if found.runnable:
            report.add("hooks", OK, f"{phase}: {', '.join(found.runnable)} in {where}{extra}")
        elif phase == hooks.PRE_APPROVE and config.require_pre_approve_hook:
            report.add("hooks", FAIL, f"{phase}: none installed in {where} and require_pre_approve_hook is "
                       f"on: approvals that ask for the hook will fail{extra}")
        elif phase == hooks.PRE_APPROVE:
            report.add("hooks", WARN, f"{phase}: none installed in {where}: an approval that asks for the "
                       f"hook (the default policy can) is approved without draining{extra}")
        else:
            report.add("hooks", OK, f"{phase}: none installed in {where}{extra}")


def _event_summary(document: Any) -> Optional[List[Dict[str, Any]]]:
    events = document.get("Events") if isinstance(document, dict) else None
    if not isinstance(events, list):
        return None
    keys = ("EventId", "EventType", "EventStatus", "EventSource", "NotBefore", "Resources")
    return [{k: e.get(k) for k in keys} for e in events if isinstance(e, dict)]
