"""Load a v2-model FunctionApp and describe its functions from their own binding metadata."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import azure.functions as func

log = logging.getLogger("sandbox.functions")

# For benchmarks (bench.fleet_scale): when this setting names a file, the CPU seconds spent inside each
# function's invocations (their own thread's CPU time: the app's code, not this runner's receive loops,
# load balancing or timers) are kept there as running totals, {"ingest": 12.3, ...}.
CPU_FILE_SETTING = "SANDBOX_INVOCATION_CPU_FILE"
_cpu_lock = threading.Lock()
_cpu_totals: Dict[str, float] = {}


def _count_cpu(name: str, seconds: float) -> None:
    path = os.environ.get(CPU_FILE_SETTING)
    if not path:
        return
    with _cpu_lock:
        _cpu_totals[name] = _cpu_totals.get(name, 0.0) + seconds
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(_cpu_totals, out)
        os.replace(tmp, path)  # readers see a whole file


@dataclass
class FunctionSpec:
    """One function as the host sees it: its function.json bindings and the user's callable."""

    name: str
    trigger: Dict[str, Any]
    bindings: List[Dict[str, Any]]
    callable: Callable[..., Any]
    retry: Optional[Dict[str, Any]]

    @property
    def trigger_type(self) -> str:
        return str(self.trigger["type"])

    def invoke(self, reason: str, **arguments: Any) -> Any:
        """Call the function with `arguments`, logging the way the host does (Executing / Executed)."""
        invocation = str(uuid.uuid4())
        log.info("Executing 'Functions.%s' (Reason='%s', Id=%s)", self.name, reason, invocation)
        started, cpu = time.monotonic(), time.thread_time()
        try:
            result = self.callable(**self._accepted(arguments, invocation))
            if inspect.isawaitable(result):
                result = asyncio.run(_await(result))
        except Exception as exc:
            _count_cpu(self.name, time.thread_time() - cpu)
            log.error(
                "Executed 'Functions.%s' (Failed, Id=%s, Duration=%dms): %s: %s",
                self.name,
                invocation,
                (time.monotonic() - started) * 1000,
                type(exc).__name__,
                exc,
            )
            raise
        _count_cpu(self.name, time.thread_time() - cpu)
        log.info(
            "Executed 'Functions.%s' (Succeeded, Id=%s, Duration=%dms)",
            self.name,
            invocation,
            (time.monotonic() - started) * 1000,
        )
        # not a host line: the execution's own CPU (it runs on this thread), which load on a shared
        # machine does not lengthen as it does Duration (bench.fleet_cost prices GB-s from it)
        log.info("Execution CPU 'Functions.%s' (Id=%s, Cpu=%dus)", self.name, invocation,
                  (time.thread_time() - cpu) * 1e6)
        return result

    def _accepted(self, arguments: Dict[str, Any], invocation: str) -> Dict[str, Any]:
        parameters = inspect.signature(self.callable).parameters
        if "context" in parameters and "context" not in arguments:
            arguments = {**arguments, "context": InvocationContext(invocation, self.name)}
        return arguments


@dataclass(frozen=True)
class InvocationContext:
    """What a function's `context` parameter offers here (a subset of func.Context)."""

    invocation_id: str
    function_name: str


async def _await(awaitable: Any) -> Any:
    return await awaitable


def find_app(module: Any) -> func.FunctionApp:
    """The module's FunctionApp (conventionally `app`), found by type, not by name."""
    apps = [v for v in vars(module).values() if isinstance(v, func.FunctionApp)]
    if len(apps) != 1:
        raise RuntimeError(
            f"{module.__name__} must define exactly one azure.functions.FunctionApp; found {len(apps)}"
        )
    return apps[0]


@functools.cache
def load_functions(module_name: str) -> Tuple[FunctionSpec, ...]:
    """Import `module_name` and list its functions from get_functions() / get_function_json().

    Cached: a FunctionApp can be indexed only once (a second get_functions() raises "does not have a
    unique function name", as in the real worker), so every reader in a process shares this result.
    """
    module = importlib.import_module(module_name)
    specs = []
    for fn in find_app(module).get_functions():
        document = json.loads(fn.get_function_json())
        bindings = document["bindings"]
        triggers = [b for b in bindings if str(b.get("type", "")).endswith("Trigger")]
        if len(triggers) != 1:
            raise RuntimeError(f"function {fn.get_function_name()} has {len(triggers)} triggers; needs one")
        specs.append(
            FunctionSpec(
                name=fn.get_function_name(),
                trigger=triggers[0],
                bindings=bindings,
                callable=fn.get_user_function(),
                retry=fn.get_settings_dict("retry_policy"),
            )
        )
    return tuple(specs)
