"""Checks a resolved configuration as a whole, before any work: one actionable line per problem.

Single values are parsed by `config.py` (a number, a choice); here are the rules a value must keep
against IMDS, Azure and the other settings. Pure functions of the settings: `problems(config)`
returns every problem, the CLI prints the first and exits 2 (`run` and `check`), so a daemon under
systemd never starts just to fail later, and `check` says the same thing as `run`.
"""

from __future__ import annotations

import re
from typing import Any, List, Sequence
from urllib.parse import urlsplit

# What IMDS documents for /metadata/scheduledevents (schemas/imds-scheduled-events.schema.json's range;
# tests/forwarder/test_config.py holds the two together).
API_VERSIONS = ("2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01",
                "2020-07-01")
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")  # the schema's EventType enum
# IMDS allows 5 requests per second per VM, token calls included. Polling at most 4 times a second
# leaves at least one request a second for the token, compute, attested-document and approval calls.
MIN_POLL_INTERVAL = 0.25
MAX_VISIBILITY = 7 * 24 * 3600  # Azure Queue storage's longest visibility timeout (Get Messages)
POST_MARGIN = 30  # seconds a message's invisibility must outlast its hook: the live check and the POST
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$")


def _url_problem(key: str, value: str, schemes: Sequence[str], example: str) -> str:
    """Why `value` is not a usable base URL with one of `schemes` ('' when it is)."""
    if not value:
        return f"{key} is empty: set it to {example}"
    if "://" not in value:
        return f"{key} {value!r} has no scheme: use {schemes[0]}://{value.strip('/')} (e.g. {example})"
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        return f"{key} {value!r} is not a valid URL ({exc}): e.g. {example}"
    if parts.scheme.lower() not in schemes:
        allowed = " or ".join(f"{s}://" for s in schemes)
        return f"{key} {value!r}: the scheme must be {allowed} (e.g. {example})"
    if not parts.hostname:
        return f"{key} {value!r} has no host: e.g. {example}"
    if parts.query or parts.fragment or parts.username or parts.password:
        return f"{key} {value!r} must not carry a query, fragment or user: e.g. {example}"
    if port == 0:
        return f"{key} {value!r} has port 0: e.g. {example}"
    return ""


def _imds(config: Any) -> List[str]:
    found = []
    # IMDS is plain HTTP on a link-local address; https:// would never answer.
    problem = _url_problem("imds_url", config.imds_url, ("http",), "http://169.254.169.254")
    if problem:
        found.append(problem)
    if config.api_version not in API_VERSIONS:
        found.append(f"api_version {config.api_version!r} is not a scheduled-events api-version IMDS "
                     f"documents: use one of {', '.join(API_VERSIONS)} (newest: {API_VERSIONS[-1]})")
    return found


def _daemon(config: Any) -> List[str]:
    found = []
    if config.poll_interval < MIN_POLL_INTERVAL:
        rate = 1.0 / config.poll_interval
        found.append(f"poll_interval {config.poll_interval:g} s is {rate:g} requests/s, past IMDS's budget "
                     f"of 5 per second per VM (shared with token and approval calls): use at least "
                     f"{MIN_POLL_INTERVAL:g} (IMDS recommends 1)")
    unknown = [t for t in config.local_event_types if t not in EVENT_TYPES]
    if unknown:
        found.append(f"local_event_types: {', '.join(unknown)} is not an IMDS event type; use a "
                     f"comma-separated list from {', '.join(EVENT_TYPES)} (empty: none)")
    return found


def _sink(config: Any) -> List[str]:
    found = []
    namespace, name, conn = config.eventhub_namespace, config.eventhub_name, config.eventhub_connection_string
    if config.sink == "eventhub":
        if namespace and conn:
            found.append("set either eventhub_namespace (managed identity) or eventhub_connection_string "
                         "(emulator/sandbox only), not both")
        elif not namespace and not conn:
            found.append("the eventhub sink needs eventhub_namespace=<ns>.servicebus.windows.net (and "
                         "eventhub_name), or eventhub_connection_string for the emulator/sandbox")
        elif namespace and not name:
            found.append("eventhub_namespace is set but eventhub_name is empty: set eventhub_name to the "
                         "Event Hub the forwarders publish to")
        elif conn and not name and "entitypath=" not in conn.lower():
            found.append("eventhub_connection_string has no EntityPath: set eventhub_name")
        if namespace and ("://" in namespace or "/" in namespace or not _HOST.match(namespace)):
            found.append(f"eventhub_namespace {namespace!r} must be a host name like "
                         "<ns>.servicebus.windows.net (no scheme, no path)")
    elif name and config.source("sink") == "default":
        found.append(f"eventhub_name {name!r} is set but neither eventhub_namespace nor "
                     "eventhub_connection_string: set eventhub_namespace=<ns>.servicebus.windows.net "
                     "(or --sink file to publish to a file)")
    if config.authenticate and config.sink != "eventhub":
        found.append("authenticate signs envelopes on the Event Hubs sink: set the eventhub sink's "
                     "settings, or turn authenticate off")
    for key in ("client_id", "queue_client_id"):
        value = getattr(config, key)
        if value and not _GUID.match(value):
            found.append(f"{key} {value!r} is not a GUID: give the user-assigned identity's "
                         "client id (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), or leave it empty for the "
                         "system-assigned one")
    return found


def _approvals(config: Any) -> List[str]:
    found = []
    uri, conn = config.queue_service_uri, config.queue_connection_string
    if uri and conn:
        found.append("set either queue_service_uri (managed identity) or queue_connection_string "
                     "(Azurite/sandbox only), not both")
    if uri:
        # A bearer token is never sent over plain HTTP (azure-core refuses): https only.
        problem = _url_problem("queue_service_uri", uri, ("https",),
                               "https://<account>.queue.core.windows.net")
        if problem:
            found.append(problem)
    if (uri or conn) and config.approval_visibility_timeout > MAX_VISIBILITY:
        found.append(f"approval_visibility_timeout {config.approval_visibility_timeout} s is longer than "
                     f"Azure Queue storage allows ({MAX_VISIBILITY} s, 7 days): every queue read would be "
                     "refused")
    if (uri or conn) and config.approval_visibility_timeout <= config.hook_timeout + POST_MARGIN:
        found.append(f"approval_visibility_timeout {config.approval_visibility_timeout} s must exceed "
                     f"hook_timeout ({config.hook_timeout:g} s) + {POST_MARGIN} s, or a message reappears "
                     f"while its hook runs: set it to at least "
                     f"{int(config.hook_timeout) + POST_MARGIN + 1}, or lower hook_timeout")
    return found


def problems(config: Any) -> List[str]:
    """Every problem of `config` for `run`/`check`, most basic first ([] = usable)."""
    return _imds(config) + _daemon(config) + _sink(config) + _approvals(config)


def approve_problems(config: Any) -> List[str]:
    """What `se-forwarder approve` needs: IMDS settings only."""
    return _imds(config)
