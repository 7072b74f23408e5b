"""CLI: `python -m sandbox.imds --port N [--time-scale X] [--vm JSON|NAME ...]` (docs/imds-simulator.md)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import List, Optional, Sequence

from .attested import DEFAULT_LIFETIME, AttestedDocuments, SandboxPki
from .identity import Identity, from_spec
from .server import build, run_forever, serve


def _vm(value: str) -> Identity:
    """--vm takes a JSON object ({"name": "vm0", "vmId": ...}) or a bare name."""
    text = value.strip()
    try:
        spec = json.loads(text) if text.startswith("{") else {"name": text}
        return from_spec(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad --vm {value!r}: {exc}") from exc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sandbox.imds",
                                description="Azure IMDS Scheduled Events simulator (loopback only).")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8169, help="listen port (default 8169; 0 = any free port)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="simulated durations pass X times faster in real time (default 1)")
    p.add_argument("--vm", type=_vm, action="append", default=None, metavar="JSON|NAME",
                   help='a VM to serve, e.g. \'{"name":"vm0","vmId":"..."}\' or a bare name; repeatable; '
                        'default one VM "vm0"')
    p.add_argument("--rate-limit", type=int, default=5,
                   help="requests per VM per window before 429 (default 5; 0 disables)")
    p.add_argument("--rate-window", type=float, default=1.0, help="the sliding window in seconds (default 1)")
    p.add_argument("--first-call-delay", type=float, default=0.0, metavar="S",
                   help="delay each VM's first /metadata request by S real seconds (IMDS may take 2 min)")
    p.add_argument("--token-lifetime", type=int, default=86399, metavar="S",
                   help="seconds a managed-identity token lasts (default 86399, as on Azure; soaks shorten "
                        "it so a sped-up run refreshes tokens)")
    p.add_argument("--attestation-dir", type=Path, default=None, metavar="DIR",
                   help="write DIR/trust.pem: the run's test root + intermediate that sign attested "
                        "documents (keys stay in memory)")
    p.add_argument("--attestation-lifetime", type=float, default=DEFAULT_LIFETIME, metavar="S",
                   help="seconds an attested document is valid (default 21600, as on Azure)")
    p.add_argument("--attestation-cache-seconds", type=float, default=0.0, metavar="S",
                   help="answer the same attested document for S seconds whatever the nonce (IMDS caches)")
    feed = p.add_argument_group("platform feed", "Azure's own Scheduled Events feed (Event Grid system "
                                "topic events) published into Event Hubs (docs/imds-simulator.md)")
    feed.add_argument("--platform-feed", metavar="CONNECTION_STRING", default="",
                      help="publish each event's transitions to this hub (connection string with EntityPath)")
    feed.add_argument("--platform-duplicates", action="store_true", help="send every platform event twice")
    feed.add_argument("--platform-reorder", action="store_true",
                      help="hold each platform event back until the next one was sent")
    feed.add_argument("--platform-delay", type=float, default=0.0, metavar="S",
                      help="send each platform event S seconds late")
    p.add_argument("--resource-graph-rows", type=Path, default=None, metavar="FILE",
                   help="Resource Graph's stand-in also answers these rows (a JSON array of "
                        "maintenanceresources rows), besides the fabric's own events")
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.time_scale <= 0:
        parser().error("--time-scale must be > 0")
    if args.token_lifetime < 1:
        parser().error("--token-lifetime must be >= 1")
    vms: List[Identity] = args.vm or [from_spec({"name": "vm0"})]
    if len({v.name for v in vms}) != len(vms):
        parser().error("VM names must be unique")
    attestation = AttestedDocuments(SandboxPki.generate(vms[0].location), lifetime=args.attestation_lifetime,
                                    cache_seconds=args.attestation_cache_seconds)
    if args.attestation_dir is not None:
        attestation.pki.write_trust(args.attestation_dir)
    sim = build(vms, args.time_scale, args.rate_limit, args.rate_window, args.first_call_delay, args.verbose,
                attestation=attestation)
    sim.metadata.token_lifetime = args.token_lifetime
    if args.resource_graph_rows is not None and sim.graph is not None:
        try:
            rows = json.loads(args.resource_graph_rows.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            parser().error(f"--resource-graph-rows {args.resource_graph_rows}: {exc}")
        if not isinstance(rows, list):
            parser().error("--resource-graph-rows: a JSON array of rows")
        sim.graph.fixture = rows
    feed = None
    if args.platform_feed:
        from .platform_feed import FeedFaults, PlatformFeed

        faults = FeedFaults(args.platform_duplicates, args.platform_reorder, args.platform_delay)
        feed = PlatformFeed(args.platform_feed, vms, faults)
        sim.fabric.listeners.append(feed)
    httpd = serve(sim, args.host, args.port)

    def stop(signum: int, _frame: object) -> None:
        # shutdown() blocks until serve_forever returns: call it off the main thread.
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = httpd.server_address[:2]
    print(json.dumps({"msg": "imds simulator listening", "url": f"http://{host}:{port}",
                      "vms": [v.name for v in vms], "timeScale": args.time_scale}), flush=True)
    run_forever(sim, httpd)
    if feed is not None:
        feed.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
