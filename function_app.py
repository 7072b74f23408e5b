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
    # A batch of news (a duplicate, a stale or bad envelope, a decision) is logged at Information; a
    # routine one (every envelope processed, nothing decided) at Debug, which host.json does not send:
    # at 10,000 VMs these lines were a quarter of the Log Analytics bill (docs/sizing.md), and the
    # `se.` markers, the log store tables and the envelope metrics already say what they said.
    routine = result.processed == result.received and not (result.duplicates or result.stale
                                                             or result.quarantined or result.decisions)
    log.log(
        logging.DEBUG if routine else logging.INFO,
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


def _caller(req: func.HttpRequest, need: str) -> Any:
    """The signed-in caller if their Entra ID token is valid and their app role allows `need`, else the
    401/403 answer (central.runtime.operator_access: the token validated in the app when
    OPERATOR_API_AUDIENCE is set; else the platform's principal, read only when App Service authentication
    is on for this app)."""
    from central.runtime import signed_in

    try:
        who = signed_in(dict(req.headers), os.environ, need)
    except ValueError as exc:  # the OPERATOR_API_* settings are incomplete: refuse, say what to fix
        return _error(str(exc), 503)
    return _error(who.message, who.status) if hasattr(who, "status") else who


# Operators' routes: authLevel anonymous at the Functions level because App Service authentication (Entra
# ID, infra/app/auth.bicep) stands in front of them and central checks the caller's app role; with the
# platform's authentication off they answer 401 to everyone (docs/security.md, "Operators").
@app.route(route="events/pending", methods=[func.HttpMethod.GET], auth_level=func.AuthLevel.ANONYMOUS)
def pending(req: func.HttpRequest) -> func.HttpResponse:
    who = _caller(req, "read")
    return who if isinstance(who, func.HttpResponse) else _json(central().pending())


@app.route(route="events/{event_id}", methods=[func.HttpMethod.GET], auth_level=func.AuthLevel.ANONYMOUS)
def event(req: func.HttpRequest) -> func.HttpResponse:
    """One event, open or ended, with its decision history (EventIds match in any case)."""
    who = _caller(req, "read")
    if isinstance(who, func.HttpResponse):
        return who
    try:
        return _json(central().event(req.route_params["event_id"]))
    except LookupError as exc:
        return _error(str(exc), 404)


@app.route(route="events/{event_id}/{action}", methods=[func.HttpMethod.POST],
           auth_level=func.AuthLevel.ANONYMOUS)
def decide(req: func.HttpRequest) -> func.HttpResponse:
    """approve | hold | release one event by hand, signed in with the Operator role. Body:
    {"reason": "..."} and, for approve, optionally "hook": true (the VM runs its pre-approve hook, e.g. a
    drain, first) or "via": "arm" (central approves through ARM, no VM involved). Who decided is the
    signed-in principal (name and object id); a body "operator" is only a note."""
    who = _caller(req, "decide")
    return who if isinstance(who, func.HttpResponse) else _decision(req, who)


# Machine callers (a paging bot, a runbook): a named function key, on a route App Service authentication
# excludes. The decision is recorded as key:<name> (OPERATOR_KEY_SHA256 names the keys).
@app.route(route="automation/events/{event_id}/{action}", methods=[func.HttpMethod.POST])
def decide_by_key(req: func.HttpRequest) -> func.HttpResponse:
    from central.runtime import named_key

    try:
        who = named_key(dict(req.headers), os.environ)
    except ValueError as exc:  # OPERATOR_KEY_SHA256 misconfigured: refuse, say what to fix
        return _error(str(exc), 503)
    return _error(who.message, who.status) if hasattr(who, "status") else _decision(req, who)


def _decision(req: func.HttpRequest, who: Any) -> func.HttpResponse:
    if len(req.get_body()) > MAX_DECISION_BODY:  # an operator decision is a few hundred bytes
        return _error(f"the body is larger than {MAX_DECISION_BODY} bytes; send "
                      '{"reason": "..."} only', 413)
    try:
        body = req.get_json() if req.get_body() else {}
    except ValueError:
        return _error('the body must be JSON: {"reason": "..."}', 400)
    if not isinstance(body, dict):
        return _error("the body must be a JSON object", 400)
    reason = str(body.get("reason") or "").strip()
    hook = body.get("hook", False)
    via = body.get("via", "queue")
    action = req.route_params["action"].lower()
    if action not in ("approve", "hold", "release"):
        return _error(f"unknown action {action!r}: approve | hold | release", 404)
    if not reason:
        return _error("a reason is required", 400)
    if not isinstance(hook, bool):
        return _error('"hook" must be true or false', 400)
    if via not in ("queue", "arm"):
        return _error('"via" must be "queue" (the VM\'s forwarder, default) or "arm"', 400)
    from central.runtime import InvalidRequest, UnknownEvent

    note = who.note_from(body)
    try:
        outcome = central().decide(req.route_params["event_id"], action, who.decided_by,
                                   f"{reason} {note}" if note else reason, hook=hook, via=via)
    except UnknownEvent as exc:
        return _error(str(exc), 404)
    except InvalidRequest as exc:
        return _error(str(exc), 409)
    return _json(outcome)


@app.route(route="fleet", methods=[func.HttpMethod.GET], auth_level=func.AuthLevel.ANONYMOUS)
def fleet(req: func.HttpRequest) -> func.HttpResponse:
    """Every VM: last heard, outbox, forwarder version, open events, silent or not (se-fleet status)."""
    who = _caller(req, "read")
    return who if isinstance(who, func.HttpResponse) else _json(central().fleet())


@app.route(route="authn/reverify", methods=[func.HttpMethod.POST], auth_level=func.AuthLevel.ANONYMOUS)
def reverify(req: func.HttpRequest) -> func.HttpResponse:
    """Re-verify now the envelopes kept for a trust failure (after the operator repaired trust) and apply
    those that verify as of when they were received, signed in with the Operator role (se-fleet reverify)."""
    who = _caller(req, "decide")
    if isinstance(who, func.HttpResponse):
        return who
    from central.runtime import InvalidRequest

    try:
        return _json(central().reverify())
    except InvalidRequest as exc:  # sender authentication is off: nothing to re-verify
        return _error(str(exc), 409)


# The on-call console (central/console/, central.runtime.console): static files and the page's sign-in
# settings, anonymous because the page holds no data; it calls the routes above with the person's token.
@app.route(route="console/{*path}", methods=[func.HttpMethod.GET], auth_level=func.AuthLevel.ANONYMOUS)
def console(req: func.HttpRequest) -> func.HttpResponse:
    from central.runtime import console_asset

    if not req.route_params.get("path") and not req.url.split("?")[0].endswith("/"):
        return func.HttpResponse(status_code=308, headers={"Location": "/api/console/"})  # relative paths
    found = console_asset(req.route_params.get("path") or "", os.environ)
    return func.HttpResponse(found.body, status_code=found.status, mimetype=found.content_type.split(";")[0],
                             charset="utf-8", headers=found.headers)


# Probes: a function key, on a path App Service authentication excludes (a probe has no Entra token).
@app.route(route="health", methods=[func.HttpMethod.GET])
def health(req: func.HttpRequest) -> func.HttpResponse:
    return _json(central().health())
