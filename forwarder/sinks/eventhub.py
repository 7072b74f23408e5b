"""Azure Event Hubs through the azure-eventhub SDK (`EventHubProducerClient`), over AMQP.

Auth: a connection string only (the Event Hubs emulator, the sandbox's AMQP server); the SDK is the
forwarder's [sdk] extra. VMs in Azure publish with managed identity through the REST sink
(forwarder/sinks/eventhub_rest.py), which the sinks' factory picks whenever there is no connection string.

What `send` does with the outbox's pending rows (in order):
- each envelope is one event: the CloudEvent JSON as the body (structured mode), `content_type`
  `application/cloudevents+json; charset=utf-8`, partition key = the VM's scale set, else its vmId
  (forwarder.envelope.hub_partition_key), so one VM's envelopes land in one partition, in order, and one
  scale set's in one partition;
- consecutive envelopes go in as few batches as fit (`create_batch(partition_key=...)`, a new batch
  when one is full), sent one after another; any failure raises SinkError and the publisher keeps
  every row (a batch already sent is sent again: same CloudEvent ids, so consumers dedupe);
- an envelope larger than the hub accepts in any batch can never be sent: it is replaced by a
  `quarantined` note (its id, type, size, the limit, a truncated copy) so it does not block the
  outbox forever; the note's id is derived from the original's, so a resend is recognisable.

Retries: the SDK's own retry is kept small (`retry_total`); the publisher backs off with jitter.
The client is reused across sends and dropped (closed, rebuilt on the next send) after any failure.

Bounded: the SDK can block forever when a peer accepts TCP but never speaks AMQP (its SASL
handshake reads without a timeout, and `close()` then waits for the same lock). So each send runs
in a worker thread joined for at most `operation_timeout`; a worker still blocked is abandoned with
its client (a new client is built next time), and at most MAX_STUCK such workers may exist: beyond
that `send` fails at once instead of starting another, until they end (the peer closes, keepalive).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from schemas import authn as wire

from .. import logs
from ..envelope import hub_partition_key
from .base import SinkError
from .oversize import body_bytes, oversize_note

log = logs.get("sink.eventhub")

CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
# Room kept in the oversize note for everything but the truncated copy (ids, errors, vm, AMQP framing).
MAX_STUCK = 3  # abandoned, still-blocked send workers allowed before sends fail fast


class EventHubConfigError(ValueError):
    """The Event Hubs settings are incomplete or contradictory; the message says which to set."""


@dataclass(frozen=True)
class EventHubSettings:
    namespace: str = ""            # <ns>.servicebus.windows.net (managed identity)
    eventhub_name: str = ""
    connection_string: str = ""    # emulator / sandbox only
    client_id: str = ""            # user-assigned managed identity; empty = system-assigned
    retry_total: int = 1           # the SDK's own retries; the publisher does the real backoff
    send_timeout: float = 10.0     # seconds one send_batch may take before it counts as failed
    use_tls: bool = True           # REST sink: False only for the sandbox server's plain-HTTP endpoint
    operation_timeout: float = 30.0  # the most one send() may take, connecting included (see below)

    def check(self) -> None:
        if self.connection_string:
            if self.namespace:
                raise EventHubConfigError("set either eventhub_connection_string (emulator/sandbox) or "
                                          "eventhub_namespace (managed identity), not both")
            if "entitypath=" not in self.connection_string.lower() and not self.eventhub_name:
                raise EventHubConfigError("the connection string has no EntityPath: set eventhub_name")
            return
        if not self.namespace:
            raise EventHubConfigError("the eventhub sink needs eventhub_namespace "
                                      "(<ns>.servicebus.windows.net) or, for the emulator/sandbox only, "
                                      "eventhub_connection_string")
        if not self.eventhub_name:
            raise EventHubConfigError("the eventhub sink needs eventhub_name with eventhub_namespace")
        if "://" in self.namespace or "/" in self.namespace:
            raise EventHubConfigError(f"eventhub_namespace {self.namespace!r} must be a host name "
                                      "like <ns>.servicebus.windows.net (no scheme, no path)")

    @property
    def target(self) -> str:
        if self.connection_string:
            parts = dict(p.split("=", 1) for p in self.connection_string.split(";") if "=" in p)
            endpoint = parts.get("Endpoint", "?").replace("sb://", "").rstrip("/")
            return f"{endpoint}/{self.eventhub_name or parts.get('EntityPath', '?')}"
        return f"{self.namespace}/{self.eventhub_name}"


class EventHubSink:
    """`send(envelopes)` publishes in order or raises SinkError; `close()` releases the client."""

    def __init__(self, settings: EventHubSettings, client_factory: Optional[Callable[[], Any]] = None,
                 authenticator: Any = None) -> None:
        settings.check()
        self.settings = settings
        self.name = f"eventhub:{settings.target}"
        self._factory = client_factory or self._new_client
        self._client: Any = None
        self._lock = threading.Lock()  # the publisher's thread and shutdown's flush may overlap
        self._stuck: List[threading.Thread] = []
        self.oversize_replaced = 0
        # forwarder/attestation.py when `authenticate` is on: begin() per send, sign(body) per event.
        self.authenticator = authenticator
        self._sign: Optional[Callable[[bytes], Dict[str, str]]] = (
            authenticator.sign if authenticator is not None else None)

    # ---- the client --------------------------------------------------------------------------

    def _new_client(self) -> Any:
        from azure.eventhub import EventHubProducerClient

        s = self.settings
        # A small SDK retry (one quick reconnect for a link the service closed while idle); longer
        # outages come back to the publisher, which backs off with jitter and never loses the rows.
        retry = {"retry_total": s.retry_total, "retry_backoff_factor": 0.2, "retry_backoff_max": 1.0}
        if not s.connection_string:  # managed identity is the REST sink's (forwarder/sinks/eventhub_rest.py)
            raise SinkError("the AMQP sink serves connection strings only", retryable=False)
        kwargs: Dict[str, Any] = dict(retry)
        if s.eventhub_name:
            kwargs["eventhub_name"] = s.eventhub_name
        return EventHubProducerClient.from_connection_string(s.connection_string, **kwargs)

    def _producer(self) -> Any:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def _drop_client(self, client: Any = None) -> None:
        """Close `client` (default: the current one); the next send builds a new one."""
        client = client if client is not None else self._client
        if client is self._client:
            self._client = None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone anyway
                log.debug("closing a failed Event Hubs client raised; ignored")

    # ---- sending -----------------------------------------------------------------------------

    def send(self, envelopes: List[Dict[str, Any]]) -> None:
        if not envelopes:
            return
        with self._lock:
            runs = _runs_by_partition_key(envelopes)
            self._stuck = [t for t in self._stuck if t.is_alive()]
            if len(self._stuck) >= MAX_STUCK:
                raise SinkError(f"{len(self._stuck)} earlier sends to {self.settings.target} are still "
                                "blocked without an answer; not starting another until they end")
            try:
                producer = self._producer()
            except SinkError:
                raise
            except Exception as exc:  # e.g. the SDK refusing the connection string
                raise SinkError(_describe(exc), retryable=False) from exc
            if self.authenticator is not None:
                self._authenticate(claimed_subscription(envelopes))
            outcome: Dict[str, BaseException] = {}
            worker = threading.Thread(target=self._attempt, args=(producer, runs, outcome), daemon=True,
                                      name="eventhub-send")
            worker.start()
            worker.join(self.settings.operation_timeout)
            if worker.is_alive():
                # Closing would block on the hung connection's lock: abandon the client with its worker.
                self._stuck.append(worker)
                if self._client is producer:
                    self._client = None
                raise SinkError(f"no answer from Event Hubs ({self.settings.target}) within "
                                f"{self.settings.operation_timeout:g} s; kept in the outbox, retrying with a "
                                "new connection")
            if "error" in outcome:
                raise outcome["error"]

    def probe(self) -> int:
        """Open the sender link (authenticated: a missing send right or a wrong hub shows here) without
        sending anything; returns the largest event the hub accepts. For `se-forwarder check`. Raises
        SinkError; bounded by `operation_timeout` like a send."""
        with self._lock:
            try:
                producer = self._producer()
            except Exception as exc:
                raise SinkError(_describe(exc), retryable=False) from exc
            outcome: Dict[str, Any] = {}

            def attempt() -> None:
                try:
                    # create_batch() opens the link to learn its message size limit; nothing is sent.
                    outcome["size"] = producer.create_batch().max_size_in_bytes
                except Exception as exc:  # noqa: BLE001
                    outcome["error"] = exc

            worker = threading.Thread(target=attempt, daemon=True, name="eventhub-probe")
            worker.start()
            worker.join(self.settings.operation_timeout)
            if worker.is_alive():
                self._stuck.append(worker)
                self._client = None
                raise SinkError(f"no answer from Event Hubs ({self.settings.target}) within "
                                f"{self.settings.operation_timeout:g} s")
            if "error" in outcome:
                self._drop_client(producer)
                raise SinkError(_describe(outcome["error"]), retryable=not _is_auth_error(outcome["error"]))
            return int(outcome["size"])

    def _authenticate(self, subscription: str = "") -> None:
        from ..attestation import AttestationError

        try:
            self.authenticator.begin(subscription)
        except AttestationError as exc:
            raise SinkError(f"not sent unauthenticated: {exc}") from exc

    def _attempt(self, producer: Any, runs: List[Any], outcome: Dict[str, BaseException]) -> None:
        """The worker: send every run with `producer`; any failure lands in `outcome["error"]`."""
        try:
            for key, run in runs:
                self._send_run(producer, key, run)
        except SinkError as exc:
            self._drop_client(producer)
            outcome["error"] = exc
        except Exception as exc:  # noqa: BLE001 - SDK, credential, socket errors: all mean "not delivered"
            self._drop_client(producer)
            error = SinkError(_describe(exc), retryable=not _is_auth_error(exc))
            error.__cause__ = exc
            outcome["error"] = error

    def _send_run(self, producer: Any, key: str, run: List[Dict[str, Any]]) -> None:
        from azure.eventhub import EventData

        batch = producer.create_batch(partition_key=key)
        for env in run:
            event = _event(env, EventData, self._sign)
            try:
                batch.add(event)
                continue
            except ValueError:
                pass  # this batch is full
            if len(batch) > 0:
                producer.send_batch(batch, timeout=self.settings.send_timeout)
                batch = producer.create_batch(partition_key=key)
                try:
                    batch.add(event)
                    continue
                except ValueError:
                    pass  # too large even for an empty batch
            note = self._oversize_note(env, batch.max_size_in_bytes)
            try:
                batch.add(_event(note, EventData, self._sign))
            except ValueError as exc:
                raise SinkError(f"envelope {env.get('id')!r} is larger than the hub's "
                                f"{batch.max_size_in_bytes} bytes and so is its oversize note; kept in the "
                                "outbox", retryable=False) from exc
        if len(batch) > 0:
            producer.send_batch(batch, timeout=self.settings.send_timeout)

    def _oversize_note(self, env: Dict[str, Any], limit: int) -> Dict[str, Any]:
        self.oversize_replaced += 1
        note = oversize_note(env, limit)
        log.error("envelope larger than the hub accepts; publishing a quarantined note instead so the "
                  "outbox is not blocked", extra=logs.fields(id=env.get("id"), type=env.get("type"),
                                                             bytes=len(body_bytes(env)), limit=limit,
                                                             noteId=note["id"]))
        return note

    def release(self) -> None:
        """Close the connection (idle); the next send opens a new one."""
        with self._lock:
            self._drop_client()

    def close(self) -> None:
        self.release()


# ---- helpers -----------------------------------------------------------------------------------

def _event(env: Dict[str, Any], event_data: Any,
           sign: Optional[Callable[[bytes], Dict[str, str]]] = None) -> Any:
    body = body_bytes(env)
    event = event_data(body)
    event.content_type = CONTENT_TYPE
    if sign is not None:
        event.properties = sign(body)  # application properties: the signature covers these exact bytes
    return event


def _runs_by_partition_key(envelopes: List[Dict[str, Any]]) -> List[Any]:
    """Consecutive envelopes with the same partition key (one forwarder = one VM = one run)."""
    runs: List[Any] = []
    for env in envelopes:
        key = hub_partition_key(env)
        if not key:
            raise SinkError(f"envelope {env.get('id')!r} has no partitionkey (a forwarder bug); kept",
                            retryable=False)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(env)
        else:
            runs.append((key, [env]))
    return runs


def _is_auth_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name in ("AuthenticationError", "ClientAuthenticationError", "CredentialUnavailableError",
                    "TokenUnavailable")


def _describe(exc: BaseException) -> str:
    """One line: the SDK's messages span lines and repeat themselves."""
    text = " ".join(str(exc).split())
    hint = ""
    if _is_auth_error(exc):
        hint = ("; check the VM's managed identity (client_id) has 'Azure Event Hubs Data Sender' on "
                "the hub, or the connection string")
    elif type(exc).__name__ in ("ConnectError", "ConnectionLostError", "OperationTimeoutError"):
        hint = "; Event Hubs unreachable: kept in the outbox, retrying with backoff"
    return f"{type(exc).__name__}: {text[:300]}{hint}"


def claimed_subscription(envelopes: List[Dict[str, Any]]) -> str:
    """The subscription the newest envelope's vm.resourceId names, or '': what central holds the attested
    document to (central.intake.authn)."""
    vm = (envelopes[-1].get("data") or {}).get("vm") if envelopes else None
    return wire.resource_id_subscription(vm.get("resourceId") if isinstance(vm, dict) else None)
