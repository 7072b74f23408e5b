"""CLI: `python -m sandbox.eventhubs --port N --hub NAME=PARTITIONS[:cg1,cg2] [--hub ...] [--data-dir D]
[--capture-connection-string CS [--capture-interval S ...]]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from . import capture as capture_mod
from .server import serve
from .store import DEFAULT_MAX_EVENTS, Broker

_HUB = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,255})=(\d{1,4})(?::([A-Za-z0-9$._,-]+))?$")


def parse_hub(text: str) -> Tuple[str, int, Optional[List[str]]]:
    match = _HUB.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"--hub {text!r}: expected NAME=PARTITIONS or NAME=PARTITIONS:cg1,cg2 (e.g. scheduled-events=4)")
    partitions = int(match.group(2))
    if not 1 <= partitions <= 1024:
        raise argparse.ArgumentTypeError(f"--hub {text!r}: partitions must be 1..1024")
    groups = [g for g in match.group(3).split(",") if g] if match.group(3) else None
    return match.group(1), partitions, groups


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.eventhubs",
        description="A local AMQP 1.0 Event Hubs server for the azure-eventhub SDK.")
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    parser.add_argument("--hub", type=parse_hub, action="append", required=True,
                        help="NAME=PARTITIONS[:cg1,cg2]; consumer groups listed => only those and $Default "
                             "exist; none listed => any consumer group name is accepted")
    parser.add_argument("--http-port", type=int,
                        help="also serve the REST send endpoint (POST /{hub}/messages) over HTTP here")
    parser.add_argument("--data-dir", type=Path, help="persist events here (append-only, fsync'd per send)")
    parser.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS,
                        help="events kept in memory per partition, oldest evicted "
                             f"(default {DEFAULT_MAX_EVENTS})")
    parser.add_argument("--log-level", default="INFO")
    group = parser.add_argument_group(
        "Capture", "write every partition's events as Capture Avro files to blob storage, as Event Hubs "
        "Capture does (docs/eventhubs-server.md)")
    group.add_argument("--capture-connection-string", metavar="CS",
                       help="turns Capture on: the storage account (Azurite) to write to")
    group.add_argument("--capture-container", default=capture_mod.DEFAULT_CONTAINER,
                       help=f"blob container, created if missing (default {capture_mod.DEFAULT_CONTAINER})")
    group.add_argument("--capture-namespace", default="sandbox",
                       help="the {Namespace} part of blob names (default sandbox)")
    group.add_argument("--capture-interval", type=float, default=capture_mod.DEFAULT_INTERVAL,
                       help="seconds per capture window (default 300; Azure allows 60..900)")
    group.add_argument("--capture-size-limit", type=int, default=capture_mod.DEFAULT_SIZE_LIMIT,
                       help="bytes that close a window early (default 314572800)")
    group.add_argument("--capture-skip-empty", action="store_true",
                       help="write no file for a window without events (Azure's skipEmptyArchives)")
    group.add_argument("--capture-name-format", default=capture_mod.DEFAULT_NAME_FORMAT,
                       help="blob name format (default %(default)s); every field must appear")
    group.add_argument("--capture-hub", action="append", metavar="NAME",
                       help="capture only this hub (repeatable; default every hub), as Azure sets it per hub")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_events < 1:
        parser.error("--max-events must be >= 1")
    broker = Broker()
    for name, partitions, groups in args.hub:
        if broker.hub(name) is not None:
            parser.error(f"--hub {name} given twice")
        broker.add_hub(name, partitions, groups, data_dir=args.data_dir, max_events=args.max_events)
    capture = _capture(parser, args, broker)
    asyncio.run(serve(broker, args.port, capture=capture, http_port=args.http_port))
    return 0


def _capture(parser: argparse.ArgumentParser, args: argparse.Namespace,
             broker: Broker) -> Optional[capture_mod.Capture]:
    if not args.capture_connection_string:
        return None
    if args.capture_interval < 1:
        parser.error("--capture-interval must be >= 1 second (blob names have one-second resolution)")
    if args.capture_size_limit < 1:
        parser.error("--capture-size-limit must be >= 1 byte")
    problem = capture_mod.check_name_format(args.capture_name_format)
    if problem:
        parser.error(f"--capture-name-format {problem}")
    settings = capture_mod.CaptureSettings(
        connection_string=args.capture_connection_string, container=args.capture_container,
        namespace=args.capture_namespace, interval_seconds=args.capture_interval,
        size_limit_bytes=args.capture_size_limit, skip_empty=args.capture_skip_empty,
        name_format=args.capture_name_format, hubs=tuple(args.capture_hub or ()))
    try:
        return capture_mod.Capture(broker, settings, data_dir=args.data_dir)
    except ValueError as exc:  # the blob SDK's verdict on a malformed connection string
        parser.error(f"--capture-connection-string is not a storage connection string: {exc}")
        raise  # unreachable: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
