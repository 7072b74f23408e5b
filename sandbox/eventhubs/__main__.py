"""CLI: `python -m sandbox.eventhubs --port N --hub NAME=PARTITIONS[:cg1,cg2] [--hub ...] [--data-dir D]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

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
    parser.add_argument("--data-dir", type=Path, help="persist events here (append-only, fsync'd per send)")
    parser.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS,
                        help="events kept in memory per partition, oldest evicted "
                             f"(default {DEFAULT_MAX_EVENTS})")
    parser.add_argument("--log-level", default="INFO")
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
    asyncio.run(serve(broker, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
