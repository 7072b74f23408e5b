"""The runner: app settings into the environment, the app's functions loaded, one listener per trigger."""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, List, Optional

from .hostconfig import HostConfig
from .http import HttpTriggers
from .loader import FunctionSpec, load_functions
from .retry import RetryPolicy
from .settings import AppSettings

log = logging.getLogger("sandbox.functions")

# Binding types this runner implements besides the triggers ($return of an HTTP function).
_OUTPUT_BINDINGS = {"http"}


class Runner:
    """Runs every function of `app_module` from its bindings until stop()."""

    def __init__(
        self,
        app_module: str,
        settings_path: Path,
        app_dir: Optional[Path] = None,
        host_json: Optional[Path] = None,
        http_port: int = 7071,
    ) -> None:
        self.app_module = app_module
        self.app_dir = Path(app_dir or Path.cwd()).resolve()
        self.settings = AppSettings.load(settings_path)
        self.host = HostConfig.load(host_json or self.app_dir / "host.json")
        self.http_port = http_port
        self.stop_event = threading.Event()
        self.listeners: List[Any] = []
        self.http: Optional[HttpTriggers] = None

    def start(self) -> None:
        # The host hands app settings to the worker as environment variables before loading the app.
        os.environ.update(self.settings.as_environment())
        if str(self.app_dir) not in sys.path:
            sys.path.insert(0, str(self.app_dir))
        specs = load_functions(self.app_module)
        for spec in specs:
            unsupported = [
                b["type"]
                for b in spec.bindings
                if b is not spec.trigger and b["type"] not in _OUTPUT_BINDINGS
            ]
            if unsupported:
                raise RuntimeError(
                    f"function {spec.name}: bindings {unsupported} are not supported by this runner"
                )
        http_specs = [s for s in specs if s.trigger_type == "httpTrigger"]
        if http_specs:
            self.http = HttpTriggers(http_specs, self.settings, self.host.route_prefix, self.http_port)
        for spec in specs:
            if spec.trigger_type == "httpTrigger":
                assert self.http is not None
                log.info("Loaded function %s: %s", spec.name, self.http.describe(spec))
                continue
            listener = self._listener(spec)
            log.info("Loaded function %s: %s", spec.name, listener.describe())
            self.listeners.append(listener)
        log.info("%d functions loaded from %s", len(specs), self.app_module)
        for listener in self.listeners:
            listener.start()
        if self.http is not None:
            self.http.start()
            log.info("HTTP triggers on http://127.0.0.1:%d/%s", self.http.port, self.host.route_prefix)

    def _listener(self, spec: FunctionSpec) -> Any:
        # A function-level retry (@app.retry) overrides host.json's, as on the host.
        retry = RetryPolicy.from_mapping(spec.retry or self.host.retry)
        if spec.trigger_type == "eventHubTrigger":
            from .eventhub import EventHubTrigger  # the SDKs load only when an app has such a trigger

            return EventHubTrigger(spec, self.settings, self.host.event_hubs, retry, self.stop_event)
        if spec.trigger_type == "timerTrigger":
            from .singleton import host_id
            from .timer import TimerTrigger

            host = host_id(self.settings, self.app_dir)
            return TimerTrigger(spec, self.settings, retry, self.stop_event, host, self.host.singleton)
        raise RuntimeError(
            f"function {spec.name}: trigger type {spec.trigger_type!r} is not supported "
            "(eventHubTrigger, timerTrigger, httpTrigger)"
        )

    def stop(self, timeout: float = 15.0) -> None:
        """Stop taking new work, let running invocations finish, release Event Hubs partitions."""
        self.stop_event.set()
        if self.http is not None:
            self.http.stop()
        for listener in self.listeners:
            if hasattr(listener, "close"):
                listener.close()
        for listener in self.listeners:
            listener.join(timeout)
        log.info("stopped")
