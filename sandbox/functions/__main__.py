"""`python -m sandbox.functions --settings FILE [--app function_app]`: run a Function app locally."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import List, Optional

from .runner import Runner


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.functions", description=__doc__)
    parser.add_argument("--settings", type=Path, required=True, help="local.settings.json-style file")
    parser.add_argument("--app", default="function_app", help="module holding the FunctionApp")
    parser.add_argument("--app-dir", type=Path, default=None, help="directory of the app (default: cwd)")
    parser.add_argument("--host-json", type=Path, default=None, help="default: APP_DIR/host.json")
    parser.add_argument("--port", type=int, default=7071, help="HTTP triggers' loopback port (0: any free)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("azure").setLevel(logging.WARNING)

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    runner = None
    try:
        runner = Runner(
            args.app, args.settings, app_dir=args.app_dir, host_json=args.host_json, http_port=args.port
        )
        runner.start()
    except (ValueError, RuntimeError, ImportError, OSError) as exc:  # SettingsError is a ValueError
        logging.getLogger("sandbox.functions").error("cannot start: %s: %s", type(exc).__name__, exc)
        if runner is not None:
            runner.stop()
        return 2
    while not stopping.wait(1.0):
        pass
    runner.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
