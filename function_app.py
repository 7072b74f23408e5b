"""The Functions entry (Python v2 programming model): bindings only; the policy lives in `central`.

Setting names used here are exactly those in central/app_settings.json (tests/functions checks it).
This is the only module of the central side that reads the environment.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, List, Optional

import azure.functions as func

if TYPE_CHECKING:
    from central.runtime import CentralService

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
log = logging.getLogger("function_app")


def _metrics() -> None:
    """central's OpenTelemetry metrics to Application Insights (a no-op without a connection string). The
    host keeps shipping the log lines; a telemetry problem never stops the functions."""
    from central.runtime import configure_metrics

    try:
        configure_metrics(os.environ.get("APPLICATIONINSIGHTS_CONNECTION_STRING", ""),
                          os.environ.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", ""))
    except Exception:  # metrics are best effort; the reason is logged
        log.exception("metrics: Application Insights export not configured")


_metrics()

_service: Optional[CentralService] = None
MAX_DECISION_BODY = 64 * 1024  # bytes of an operator decision body read at most (reason is cut to 4000)
_service_lock = threading.Lock()


def central() -> CentralService:
    """One CentralService per worker process, built on first use from the app settings."""
    global _service
    if _service is None:
        with _service_lock:
            if _service is None:
                from central.runtime import CentralService

                _service = CentralService.from_settings(dict(os.environ))
    return _service


def _json(body: Any, status_code: int = 200) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body, default=str), status_code=status_code, mimetype="application/json"
    )


def _error(message: str, status_code: int) -> func.HttpResponse:
    """Every error this app answers: {"error": "<what is wrong and what to do>", "status": <code>}."""
    return _json({"error": message, "status": status_code}, status_code)


# Bad envelopes never raise (central quarantines them); only infrastructure failures (Storage
# unreachable...) raise, so the host's retry policy (host.json "retry") runs the batch again before the
# checkpoint moves on. The hub's enqueued time is central's clock for liveness and ordering.
@app.event_hub_message_trigger(
    arg_name="events",
    event_hub_name="%EVENTHUB_NAME%",
    consumer_group="%EVENTHUB_CONSUMER_GROUP%",
    connection="EventHubConnection",
    cardinality=func.Cardinality.MANY,
)
def ingest(events: List[func.EventHubEvent]) -> None:
    from central.runtime import properties_of

    result = central().handle_batch(
        [event.get_body() for event in events],
        enqueued_times=[event.enqueued_time for event in events],
        properties=properties_of(events[0].metadata if events else None, len(events)),
    )
    log.info(
        "ingest: %d received, %d processed, %d duplicates, %d stale, %d quarantined, %d decisions",
        result.received,
        result.processed,
        result.duplicates,
        result.stale,
        result.quarantined,
        len(result.decisions),
    )


# The platform's witness (Event Grid's ScheduledEventEmitted events): its own hub, so no VM can speak as
# the platform. Bad events are quarantined, never raised; only a storage failure retries the batch.
@app.event_hub_message_trigger(
    arg_name="events",
    event_hub_name="%PLATFORM_EVENTHUB_NAME%",
    consumer_group="%EVENTHUB_CONSUMER_GROUP%",
    connection="EventHubConnection",
    cardinality=func.Cardinality.MANY,
)
def platform(events: List[func.EventHubEvent]) -> None:
    result = central().handle_platform_batch(
        [event.get_body() for event in events], enqueued_times=[event.enqueued_time for event in events]
    )
    log.info("platform: %d received, %d processed, %d duplicates, %d stale, %d quarantined, %d decisions",
             result.received, result.processed, result.duplicates, result.stale, result.quarantined,
             len(result.decisions))


@app.timer_trigger(arg_name="timer", schedule="%REEVALUATE_SCHEDULE%", run_on_startup=False)
def reevaluate(timer: func.TimerRequest) -> None:
    if timer.past_due:
        log.warning("reevaluate: running late (past due)")
    decisions = central().reevaluate()
    log.info("reevaluate: %d decisions", len(decisions))


@app.route(route="events/pending", methods=[func.HttpMethod.GET])
def pending(req: func.HttpRequest) -> func.HttpResponse:
    return _json(central().pending())


@app.route(route="events/{event_id}", methods=[func.HttpMethod.GET])
def event(req: func.HttpRequest) -> func.HttpResponse:
    """One event, open or ended, with its decision history (EventIds match in any case)."""
    try:
        return _json(central().event(req.route_params["event_id"]))
    except LookupError as exc:
        return _error(str(exc), 404)


@app.route(route="events/{event_id}/{action}", methods=[func.HttpMethod.POST])
def decide(req: func.HttpRequest) -> func.HttpResponse:
    """approve | hold | release one event by hand. Body: {"reason": "...", "operator": "..."} and, for
    approve, optionally "hook": true (the VM runs its pre-approve hook, e.g. a drain, first).

    The operator is the signed-in principal when App Service authentication is on (the platform sets
    X-MS-CLIENT-PRINCIPAL-NAME and strips it from clients); otherwise the body's `operator`, which
    the function key alone vouches for.
    """
    if len(req.get_body()) > MAX_DECISION_BODY:  # an operator decision is a few hundred bytes
        return _error(f"the body is larger than {MAX_DECISION_BODY} bytes; send "
                      '{"reason": "...", "operator": "..."} only', 413)
    try:
        body = req.get_json() if req.get_body() else {}
    except ValueError:
        return _error('the body must be JSON: {"reason": "...", "operator": "..."}', 400)
    if not isinstance(body, dict):
        return _error("the body must be a JSON object", 400)
    operator = req.headers.get("x-ms-client-principal-name") or str(body.get("operator") or "").strip()
    reason = str(body.get("reason") or "").strip()
    hook = body.get("hook", False)
    action = req.route_params["action"].lower()
    if action not in ("approve", "hold", "release"):
        return _error(f"unknown action {action!r}: approve | hold | release", 404)
    if not operator or not reason:
        return _error("an operator and a reason are required", 400)
    if not isinstance(hook, bool):
        return _error('"hook" must be true or false', 400)
    try:
        outcome = central().decide(req.route_params["event_id"], action, operator, reason, hook=hook)
    except LookupError as exc:
        return _error(str(exc), 404)
    except ValueError as exc:
        return _error(str(exc), 409)
    return _json(outcome)


@app.route(route="fleet", methods=[func.HttpMethod.GET])
def fleet(req: func.HttpRequest) -> func.HttpResponse:
    """Every VM: last heard, outbox, forwarder version, open events, silent or not (se-fleet status)."""
    return _json(central().fleet())


@app.route(route="health", methods=[func.HttpMethod.GET])
def health(req: func.HttpRequest) -> func.HttpResponse:
    return _json(central().health())
