"""The Storage queue clients: this VM's approval queue and its optional poison queue.

In Azure the forwarder authenticates with its managed identity (Storage Queue Data Message
Processor on its own queue: receive, delete; no send). Against Azurite a connection string is used.
"""

from __future__ import annotations

from typing import Any, Optional

from ..sinks.tls_trust import hashed_ca_dir

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
    plain text; `message.decode` accepts plain JSON and base64 JSON alike. The SDK is imported here, when
    the first approval may be waiting, not at start: an idle forwarder does not carry it."""
    from azure.storage.queue import QueueClient

    if connection_string:
        return QueueClient.from_connection_string(connection_string, queue_name, **CLIENT_OPTIONS)
    if not service_uri:
        raise ValueError(
            "approvals need --queue-service-uri (https://<account>.queue.core.windows.net) "
            "or --queue-connection-string"
        )
    if credential is None:
        raise ValueError("a queue service URI needs a credential (the managed identity)")
    # HTTPS verified against the OS's hashed CA directory, as the Event Hubs sink does: OpenSSL loads a
    # CA only when a chain needs it, where requests' default loads certifi's whole bundle (~1.5 MiB).
    capath = hashed_ca_dir()
    verify = {"connection_verify": capath} if capath else {}
    return QueueClient(account_url=service_uri, queue_name=queue_name, credential=credential,
                       **CLIENT_OPTIONS, **verify)


def poison_queue_name(queue_name: str) -> str:
    return (queue_name[: 63 - len(POISON_SUFFIX)] + POISON_SUFFIX).replace("--", "-")
