"""The Storage queue clients: this VM's approval queue and its optional poison queue.

In Azure the forwarder authenticates with its managed identity (Storage Queue Data Message
Processor on its own queue: receive, delete; no send) through the Queue service's REST API
(forwarder/approvals/queue_rest.py, http.client). A connection string (Azurite, tests) uses the
azure-storage-queue SDK, which a VM install does not carry.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

from .queue_rest import QueueError, QueueNotFound, QueueRestClient

POISON_SUFFIX = "-poison"
# The SDK's default retries wait 15 s, 18 s, 24 s... inside one call. The reader has its own jittered
# backoff around each poll, so the SDK retries little and fails fast; short timeouts keep a hung
# connection from stalling approvals.
CLIENT_OPTIONS = {"retry_total": 1, "initial_backoff": 0.5, "increment_base": 2,
                  "retry_to_secondary": False, "connection_timeout": 5, "read_timeout": 20}


def queue_client(
    queue_name: str,
    service_uri: Optional[str] = None,
    connection_string: Optional[str] = None,
    credential: Any = None,
) -> Any:
    """A QueueClient for `queue_name`: from a connection string (Azurite, tests) or the service URI plus a
    credential (production: the IMDS-rate-limited managed identity credential). Messages are read as
    plain text; `message.decode` accepts plain JSON and base64 JSON alike. Built when the first approval
    may be waiting, not at start: an idle forwarder carries neither client."""
    if connection_string:
        try:
            from azure.storage.queue import QueueClient
        except ImportError as exc:
            raise ValueError("queue_connection_string (Azurite, tests) needs the azure-storage-queue SDK, "
                             "which the VM install does not carry; on a VM use queue_service_uri") from exc
        return QueueClient.from_connection_string(connection_string, queue_name, **CLIENT_OPTIONS)
    if not service_uri:
        raise ValueError(
            "approvals need --queue-service-uri (https://<account>.queue.core.windows.net) "
            "or --queue-connection-string"
        )
    if credential is None:
        raise ValueError("a queue service URI needs a credential (the managed identity)")
    # HTTPS verified against the OS's hashed CA directory (forwarder/sinks/tls_trust.py), as the Event
    # Hubs sink does.
    return QueueRestClient(service_uri, queue_name, credential)


def errors() -> Tuple[Tuple[type, ...], Tuple[type, ...]]:
    """(any queue failure, the queue is missing): the REST client's classes, and the SDK's when it is
    loaded (a connection string), without importing it otherwise."""
    unavailable: Tuple[type, ...] = (QueueError,)
    missing: Tuple[type, ...] = (QueueNotFound,)
    core = sys.modules.get("azure.core.exceptions")
    if core is not None:
        unavailable += (core.AzureError,)
        missing += (core.ResourceNotFoundError,)
    return unavailable, missing


def poison_queue_name(queue_name: str) -> str:
    return (queue_name[: 63 - len(POISON_SUFFIX)] + POISON_SUFFIX).replace("--", "-")
