"""`se-forwarder`: `run` (the daemon), `check` (will `run` work?) and `approve` (an operator's approval).
The only module that reads argv/env. Exit codes: forwarder/exitcodes.py (and docs/forwarder.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import __version__, exitcodes, logs, validation
from .closed_pipe import survives_closed_pipe
from .config import SETTINGS, Config, ConfigError, Setting, load

EXIT_OK = exitcodes.OK
EXIT_USAGE = exitcodes.USAGE
EXIT_IMDS_UNAVAILABLE = exitcodes.IMDS_UNAVAILABLE
EXIT_IMDS_REJECTED = exitcodes.IMDS_REJECTED
EXIT_STATE = exitcodes.STATE
EXIT_NOT_APPROVED = exitcodes.NOT_APPROVED

EPILOG = """settings: every flag also reads env SE_FORWARDER_<NAME> and the config file key <name>
(precedence: flag > env > config file > default).
exit codes: 0 ok, 1 unexpected error, 2 bad usage/configuration, 3 IMDS did not answer,
4 IMDS refused the request, 5 document invalid, 6 state directory/outbox unusable,
7 approve: not approved, 8 run: IMDS keeps refusing (not retried forever),
9 check: a service run needs fails."""


class Switch(argparse.Action):
    """A boolean setting: `--x` turns it on, `--no-x` off (`--x true|false` still works for scripts)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        names = [*option_strings, *("--no-" + o[2:] for o in option_strings)]
        super().__init__(names, dest, nargs="?", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        off = bool(option_string and option_string.startswith("--no-"))
        setattr(namespace, self.dest, "false" if off else ("true" if values is None else values))


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows a switch as `--x, --no-x` (no value)."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        return "" if isinstance(action, Switch) else super()._format_args(action, default_metavar)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Switch):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def _add_setting(parser: argparse.ArgumentParser, s: Setting) -> None:
    default = s.default_text or "none"
    kwargs: Dict[str, Any] = {"dest": s.key, "default": argparse.SUPPRESS,
                              "help": f"{s.help} [env {s.env}; default {default}]"}
    if s.is_switch:
        parser.add_argument(s.flag, action=Switch, **kwargs)
        return
    if s.choices:
        kwargs["choices"] = s.choices
        kwargs["metavar"] = "{" + ",".join(s.choices) + "}"
    parser.add_argument(s.flag, **kwargs)


def _subparser(sub: Any, name: str, help_: str, description: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_, description=description, epilog=EPILOG,
                            formatter_class=Formatter)
    for s in SETTINGS:
        if name in s.commands:
            _add_setting(parser, s)
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="se-forwarder", description="Forward Azure IMDS Scheduled Events from this VM.",
        epilog=EPILOG, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"se-forwarder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{run,check,approve,windows-install}")
    sub.required = True
    sub.add_parser("windows-install", help="the Windows installer's steps (plan, stage, activate, uninstall; "
                   "`windows-install -h`)")
    _subparser(sub, "run", "run the forwarder daemon (until SIGTERM/SIGINT)",
               "Poll IMDS, publish each incarnation through the durable outbox, send heartbeats, carry "
               "out approvals.")
    check = _subparser(sub, "check", "check everything `run` needs; exit 0 only if it would work",
                       "Check the configuration, the state directory, IMDS (identity, document, clock), "
                       "the sink (Event Hubs: a sender link is opened, nothing sent), the approval queue "
                       "and the hooks. One line per check: ok, warn or fail. Nothing is published.")
    check.add_argument("--json", action="store_true", help="print one JSON report instead of lines")
    approve = _subparser(
        sub, "approve", "approve (start) one Scheduled event of this VM now (operator)",
        "The same checks as a central approval (IMDS lists the event now, Scheduled, this VM in "
        "Resources), optionally the pre-approve hook, then the POST; the result is published as an "
        "approval-result envelope (decidedBy operator:<user>). Exit 0 if approved, 7 if not.")
    approve.add_argument("event_id", metavar="EVENT_ID", help="the EventId IMDS lists")
    approve.add_argument("--hook", action="store_true", help="run the pre-approve hooks first; POST only "
                         "if they succeed")
    return parser


def _given(args: argparse.Namespace) -> Dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("command", "event_id", "hook", "json")}


@survives_closed_pipe
def main(argv: Optional[List[str]] = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["windows-install"]:  # the Windows installer's steps: no forwarder settings
        from .windows_install import main as windows_install

        return windows_install(given[1:])
    args = _parser().parse_args(given)
    if args.command in ("run", "check"):
        from . import deferred
        from .footprint import skip_charset_detection

        skip_charset_detection()
        deferred.install()
    try:
        config = load(_given(args), os.environ)
    except ConfigError as exc:
        return _usage(str(exc))
    from .config_rules import approve_problems, problems

    found = approve_problems(config) if args.command == "approve" else problems(config)
    if found:
        return _usage(found[0])
    logs.setup(config.log_level)
    if args.command == "run":
        return run(config)
    if args.command == "approve":
        return approve(config, args.event_id, args.hook, _operator())
    from .check import check

    return check(config, as_json=args.json)


def _usage(message: str) -> int:
    print(f"se-forwarder: configuration error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _operator() -> str:
    """Who runs `approve`: the session's login name (behind sudo too: the terminal's user), else the
    account the process runs as. Never SUDO_USER, USER or LOGNAME: a caller sets those to anything. (Still
    the VM's word: central records it as the VM's, log_rows.result_decider.)"""
    try:
        return os.getlogin()
    except OSError:  # no controlling terminal (a script, ssh without a tty)
        pass
    try:
        import pwd  # (POSIX; os.getlogin answers on Windows)

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"


def approve(config: Config, event_id: str, hook: bool, user: str) -> int:
    """`se-forwarder approve EVENT_ID [--hook]` (docs/approvals.md)."""
    from . import envelope
    from .app import hook_settings
    from .approvals.approver import APPROVE, HOOK_THEN_APPROVE, Approver
    from .approvals.ledger import Ledger, LedgerError
    from .approvals.result import APPROVED
    from .identity import IdentityError, from_compute
    from .imds import ImdsClient, ImdsRejected, ImdsUnavailable
    from .outbox import Outbox, OutboxError

    client = ImdsClient(config.imds_url, config.api_version, retry_seconds=10.0)
    try:
        vm = from_compute(client.get_compute())
        approver = Approver(client, Ledger(config.state_dir), vm.vm_id, vm.name, hook_settings(config),
                            require_hook=config.require_pre_approve_hook)
        result = approver.decide(event_id, HOOK_THEN_APPROVE if hook else APPROVE, f"operator:{user}"[:256],
                                 reason="approved on the VM with se-forwarder approve")
    except ImdsUnavailable as exc:
        print(f"se-forwarder approve: {exc}", file=sys.stderr)
        return EXIT_IMDS_UNAVAILABLE
    except (ImdsRejected, IdentityError) as exc:
        print(f"se-forwarder approve: {exc}", file=sys.stderr)
        return EXIT_IMDS_REJECTED
    except LedgerError as exc:
        print(f"se-forwarder approve: {exc}", file=sys.stderr)
        return EXIT_STATE
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
    from .app import StateError, Unusable, build
    from .sinks import SinkUnavailable

    log = logs.get("cli")
    validation.use_child_process()  # jsonschema stays out of the process that idles for months
    try:
        app = build(config)
    except StateError as exc:
        log.error(str(exc))
        return EXIT_STATE
    except (SinkUnavailable, Unusable) as exc:
        log.error(str(exc))
        return EXIT_USAGE
    log.info("configuration",
             extra=logs.fields(config=config.as_dict(), version=__version__, pid=os.getpid()))
    app.daemon.install_signal_handlers()
    return app.daemon.run()


if __name__ == "__main__":
    sys.exit(main())
