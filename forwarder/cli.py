"""`se-forwarder`: `run` (the daemon) and `check` (one poll). The only module that reads argv/env.

Exit codes (documented in docs/forwarder.md):
  0 ok / clean stop          1 unexpected error         2 bad usage or configuration
  3 IMDS did not answer      4 IMDS refused the request (4xx, redirect) or its compute metadata
  5 the document is invalid (not JSON or fails the schema; `run` would quarantine it)
  6 the state directory / outbox cannot be opened
  7 `approve`: not approved (rejected by the checks, the hook failed, or the POST failed)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import __version__, logs
from .config import SETTINGS, Config, ConfigError, load

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_IMDS_UNAVAILABLE = 3
EXIT_IMDS_REJECTED = 4
EXIT_INVALID_DOCUMENT = 5
EXIT_STATE = 6
EXIT_NOT_APPROVED = 7  # `approve`: rejected by the checks, the hook failed, or the POST failed

EPILOG = """settings: every flag also reads env SE_FORWARDER_<NAME> and the config file key <name>
(precedence: flag > env > config file > default).
exit codes: 0 ok, 1 unexpected error, 2 bad usage/configuration, 3 IMDS did not answer,
4 IMDS refused the request, 5 document invalid, 6 state directory/outbox unusable,
7 approve: not approved."""


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    for s in SETTINGS:
        kwargs: Dict[str, Any] = {"dest": s.key, "default": argparse.SUPPRESS,
                                  "help": f"{s.help} [env {s.env}; default {s.default!r}]"}
        if s.choices:
            kwargs["choices"] = s.choices
        common.add_argument(s.flag, **kwargs)
    parser = argparse.ArgumentParser(
        prog="se-forwarder", description="Forward Azure IMDS Scheduled Events from this VM.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"se-forwarder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{run,check,approve}")
    sub.required = True
    sub.add_parser("run", parents=[common], help="run the forwarder daemon (until SIGTERM/SIGINT)",
                   description="Poll IMDS, publish each incarnation through the durable outbox, "
                               "send heartbeats.",
                   epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub.add_parser("check", parents=[common], help="one poll: identity, document, validation, outbox; "
                   "exit code says whether IMDS answered and the document is valid",
                   description="One poll of IMDS (nothing is published); prints a JSON report on stdout.",
                   epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    approve = sub.add_parser(
        "approve", parents=[common], help="approve (start) one Scheduled event of this VM now (operator)",
        description="The same checks as a central approval (IMDS lists the event now, Scheduled, this VM "
                    "in Resources), optionally the pre-approve hook, then the POST; the result is "
                    "published as an approval-result envelope (decidedBy operator:<user>). Exit 0 if "
                    "approved, 7 if not.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    approve.add_argument("event_id", metavar="EVENT_ID", help="the EventId IMDS lists")
    approve.add_argument("--hook", action="store_true", help="run the pre-approve hooks first; POST only "
                         "if they succeed")
    return parser


def _given(args: argparse.Namespace) -> Dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("command", "event_id", "hook")}


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load(_given(args), os.environ)
    except ConfigError as exc:
        print(f"se-forwarder: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.setup(config.log_level)
    if args.command == "run":
        return run(config)
    if args.command == "approve":
        return approve(config, args.event_id, args.hook, _operator())
    return check(config)


def _operator() -> str:
    """Who runs `approve`: the user behind sudo if any, else the login user."""
    import getpass

    return os.environ.get("SUDO_USER") or getpass.getuser()


def approve(config: Config, event_id: str, hook: bool, user: str) -> int:
    """`se-forwarder approve EVENT_ID [--hook]` (docs/approvals.md)."""
    from . import envelope
    from .app import approval_settings
    from .approvals.approver import APPROVE, HOOK_THEN_APPROVE, Approver
    from .approvals.ledger import Ledger
    from .approvals.result import APPROVED
    from .identity import IdentityError, from_compute
    from .imds import ImdsClient, ImdsRejected, ImdsUnavailable
    from .outbox import Outbox, OutboxError

    settings = approval_settings(config)
    client = ImdsClient(config.imds_url, config.api_version, retry_seconds=10.0)
    try:
        vm = from_compute(client.get_compute())
        approver = Approver(client, Ledger(config.state_dir), vm.vm_id, vm.name, settings.hooks)
        result = approver.decide(event_id, HOOK_THEN_APPROVE if hook else APPROVE, f"operator:{user}"[:256],
                                 reason="approved on the VM with se-forwarder approve")
    except ImdsUnavailable as exc:
        print(f"se-forwarder approve: {exc}", file=sys.stderr)
        return EXIT_IMDS_UNAVAILABLE
    except (ImdsRejected, IdentityError) as exc:
        print(f"se-forwarder approve: {exc}", file=sys.stderr)
        return EXIT_IMDS_REJECTED
    finally:
        client.close()
    data = result.data(vm.as_vm())
    try:
        outbox = Outbox(Path(config.state_dir), max_rows=config.outbox_max_rows)
        try:
            outbox.put(envelope.approval_result(vm, data))  # the running daemon publishes it
        finally:
            outbox.close()
        data["reported"] = True
    except OutboxError as exc:
        print(f"se-forwarder approve: result not recorded in the outbox: {exc}", file=sys.stderr)
        data["reported"] = False
    print(json.dumps(data, indent=2, default=str))
    return EXIT_OK if result.outcome == APPROVED else EXIT_NOT_APPROVED


def run(config: Config) -> int:
    from .app import build
    from .outbox import OutboxError
    from .sinks import SinkUnavailable

    log = logs.get("cli")
    try:
        app = build(config)
    except OutboxError as exc:
        log.error(str(exc))
        return EXIT_STATE
    except SinkUnavailable as exc:
        log.error(str(exc))
        return EXIT_USAGE
    log.info("configuration",
             extra=logs.fields(config=config.as_dict(), version=__version__, pid=os.getpid()))
    app.daemon.install_signal_handlers()
    return app.daemon.run()


def _event_summary(document: Any) -> Optional[List[Dict[str, Any]]]:
    events = document.get("Events") if isinstance(document, dict) else None
    if not isinstance(events, list):
        return None
    keys = ("EventId", "EventType", "EventStatus", "EventSource", "NotBefore", "Resources")
    return [{k: e.get(k) for k in keys} for e in events if isinstance(e, dict)]


def _sink_summary(config: Config) -> Dict[str, Any]:
    """Where `run` would publish (no secret: a connection string shows only its endpoint)."""
    if config.sink != "eventhub":
        return {"name": config.sink, "path": str(config.sink_path) if config.sink == "file" else None}
    from .sinks.eventhub import EventHubSettings

    settings = EventHubSettings(namespace=config.eventhub_namespace, eventhub_name=config.eventhub_name,
                                connection_string=config.eventhub_connection_string)
    auth = "connection string" if config.eventhub_connection_string else "managed identity"
    return {"name": "eventhub", "target": settings.target, "auth": auth}


def check(config: Config) -> int:
    from .clock import iso
    from .identity import IdentityError, from_compute
    from .imds import ImdsClient, ImdsRejected, ImdsUnavailable
    from .outbox import DB_NAME, Outbox, OutboxError
    from .poller import LAST_INCARNATION, parse

    logging.getLogger("forwarder").setLevel(max(logging.WARNING, logging.getLogger("forwarder").level))
    report: Dict[str, Any] = {"imds": {"url": config.imds_url, "apiVersion": config.api_version},
                              "sink": _sink_summary(config)}
    code = EXIT_OK
    client = ImdsClient(config.imds_url, config.api_version, retry_seconds=3.0)
    try:
        report["identity"] = from_compute(client.get_compute()).as_vm()
        response = client.get_scheduled_events()
        report["imds"]["answered"] = True
        parsed = parse(response.text)
        report["document"] = {"valid": not parsed.errors, "incarnation": parsed.incarnation,
                              "errors": parsed.errors, "events": _event_summary(parsed.document)}
        if parsed.errors:
            code = EXIT_INVALID_DOCUMENT
    except ImdsUnavailable as exc:
        report["imds"].update(answered=False, error=str(exc))
        code = EXIT_IMDS_UNAVAILABLE
    except (ImdsRejected, IdentityError) as exc:
        report["imds"].update(answered=True, error=str(exc))
        code = EXIT_IMDS_REJECTED
    finally:
        client.close()
    db = Path(config.state_dir) / DB_NAME
    if db.exists():
        try:
            outbox = Outbox(Path(config.state_dir), max_rows=config.outbox_max_rows)
            try:
                error_at = outbox.get_state("last_error_at")
                report["outbox"] = {**outbox.stats(), "path": str(db),
                                    "lastIncarnation": outbox.get_state(LAST_INCARNATION),
                                    "lastErrorAt": iso(error_at) if error_at else None}
            finally:
                outbox.close()
        except (OutboxError, Exception) as exc:  # noqa: BLE001 - report, never crash a health check
            report["outbox"] = {"path": str(db), "error": str(exc)}
            code = code or EXIT_STATE
    else:
        report["outbox"] = {"path": str(db), "exists": False}
    report["exitCode"] = code
    print(json.dumps(report, indent=2, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
