"""A test-only FunctionApp for the runner: records what each trigger delivered, one JSON line each.

Everything it needs comes from app settings, as in a real app: RECORD_FILE, SAMPLE_HUB, TICK_SCHEDULE,
TICK_SECONDS (how long a tick takes).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, List

import azure.functions as func

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
_lock = threading.Lock()
_calls: List[int] = []


def _record(entry: Dict[str, Any]) -> None:
    with _lock, open(os.environ["RECORD_FILE"], "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


@app.event_hub_message_trigger(
    arg_name="batch",
    event_hub_name="%SAMPLE_HUB%",
    connection="SampleHubs",
    consumer_group="%SAMPLE_GROUP%",
    cardinality=func.Cardinality.MANY,
)
def collect(batch: List[func.EventHubEvent]) -> None:
    # FAIL_FIRST_CALLS=N: the first N invocations of this process raise, as an unreachable store would.
    with _lock:
        _calls.append(1)
        failing = len(_calls) <= int(os.environ.get("FAIL_FIRST_CALLS") or 0)
    _record(
        {
            "function": "collect",
            "failed": failing,
            "events": [
                {
                    "body": e.get_body().decode(),
                    "sequence_number": e.sequence_number,
                    "offset": e.offset,
                    "partition_key": e.partition_key,
                    "enqueued_time": e.enqueued_time.isoformat() if e.enqueued_time else None,
                    "iothub_metadata": e.iothub_metadata,
                }
                for e in batch
            ],
        }
    )
    if failing:
        raise ConnectionError("simulated log store outage")


@app.timer_trigger(arg_name="timer", schedule="%TICK_SCHEDULE%")
def tick(timer: func.TimerRequest) -> None:
    started = time.time()
    time.sleep(float(os.environ.get("TICK_SECONDS") or 0))
    _record({"function": "tick", "past_due": timer.past_due, "pid": os.getpid(),
             "started": started, "ended": time.time()})


@app.route(route="echo/{name}", methods=["GET", "POST"])
def echo(req: func.HttpRequest) -> func.HttpResponse:
    body = {
        "name": req.route_params.get("name"),
        "query": dict(req.params),
        "body": req.get_body().decode(),
        "method": req.method,
    }
    return func.HttpResponse(json.dumps(body), status_code=201, mimetype="application/json")


@app.route(route="open", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def open_route(req: func.HttpRequest) -> str:
    return "open"
