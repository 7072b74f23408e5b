"""Where the outbox drains to. `make(config)` picks the sink named by the `sink` setting.

A new sink is a class with `name`, `send(envelopes)` (raises SinkError) and `close()`, plus one
entry in `FACTORIES` (a callable taking the config, the VM's IMDS rate limiter and a callable that
returns the VM's managed-identity credential, for sinks that need tokens).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Dict

from .base import Sink, SinkError


class SinkUnavailable(ValueError):
    """The configured sink cannot be built (unknown name, missing settings)."""


def _file(config: Any, limiter: Any = None, credential: Any = None) -> Sink:
    from .file import FileSink

    return FileSink(config.sink_path)


def _stdout(config: Any, limiter: Any = None, credential: Any = None) -> Sink:
    from .file import FileSink

    return FileSink(None)


def _eventhub(config: Any, limiter: Any = None, credential: Any = None) -> Sink:
    """docs/eventhub-sink.md. With the managed identity (production): the REST sink, http.client only;
    with a connection string (emulator, sandbox AMQP server): the azure-eventhub SDK, imported only then.
    `credential`: a callable returning the managed identity credential (made only when no connection
    string)."""
    from ..imds import managed_identity_credential
    from .eventhub import EventHubConfigError, EventHubSettings, EventHubSink

    settings = EventHubSettings(namespace=config.eventhub_namespace, eventhub_name=config.eventhub_name,
                                connection_string=config.eventhub_connection_string,
                                client_id=config.client_id)
    try:
        settings.check()
    except EventHubConfigError as exc:
        raise SinkUnavailable(str(exc)) from exc
    if settings.connection_string and not _installed("azure.eventhub"):
        raise SinkUnavailable("eventhub_connection_string (the emulator, the sandbox AMQP server) needs the "
                              "azure-eventhub SDK, which the VM install does not carry; on a VM set "
                              "eventhub_namespace (managed identity, the REST API)")
    token_credential = None
    if not settings.connection_string:
        token_credential = (credential() if credential is not None
                            else managed_identity_credential(settings.client_id, limiter))
    authenticator = None
    if getattr(config, "authenticate", False):
        from ..attestation import for_sink

        authenticator = for_sink(config, limiter)
    if token_credential is not None:  # managed identity: the REST send API (docs/forwarder.md, "Footprint")
        from .eventhub_rest import EventHubRestSink

        return EventHubRestSink(settings, token_credential, authenticator=authenticator)
    return EventHubSink(settings, authenticator=authenticator)  # a connection string: the AMQP SDK


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package (azure) is not installed either
        return False


FACTORIES: Dict[str, Callable[..., Sink]] = {"file": _file, "stdout": _stdout, "eventhub": _eventhub}


def make(config: Any, limiter: Any = None, credential: Any = None) -> Sink:
    try:
        factory = FACTORIES[config.sink]
    except KeyError:
        raise SinkUnavailable(f"unknown sink {config.sink!r}; known: {', '.join(FACTORIES)}") from None
    return factory(config, limiter, credential)


__all__ = ["FACTORIES", "Sink", "SinkError", "SinkUnavailable", "make"]
