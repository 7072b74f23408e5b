"""Event Hubs triggers through the real EventHubConsumerClient, checkpoints in AzureWebJobsStorage blobs.

A batch is checkpointed only after the function returned (or, as on the host, after its retries are
used up: the host moves on then too). Stopping mid-batch checkpoints nothing: the batch is redelivered.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime
from typing import Any, Dict, List, Optional

import azure.functions as func
from azure.eventhub import EventData, EventHubConsumerClient, LoadBalancingStrategy
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
from azure.functions import meta

from . import eventhub_idle
from .batching import PartitionBatcher
from .hostconfig import EventHubOptions
from .loader import FunctionSpec
from .retry import RetryPolicy, Stopped
from .settings import AppSettings, Connection, SettingsError
from .storage import blob_service_url, credential_for, webjobs_container, webjobs_storage

log = logging.getLogger("sandbox.functions")

# The Event Hubs extension's checkpoint container in AzureWebJobsStorage, and its balancing cadence.
CHECKPOINT_CONTAINER = "azure-webjobs-eventhub"
LOAD_BALANCING_INTERVAL = 10.0
OWNERSHIP_EXPIRATION = 30.0


def checkpoint_store(settings: AppSettings) -> BlobCheckpointStore:
    """Checkpoints in AzureWebJobsStorage, container `azure-webjobs-eventhub` (the extension's)."""
    needed_by = "Event Hubs triggers (checkpoints)"
    webjobs_container(settings, CHECKPOINT_CONTAINER, needed_by).close()  # there, created if missing
    storage = webjobs_storage(settings, needed_by)
    if storage.connection_string:
        return BlobCheckpointStore.from_connection_string(storage.connection_string, CHECKPOINT_CONTAINER)
    return BlobCheckpointStore(
        blob_service_url(storage), CHECKPOINT_CONTAINER, credential=credential_for(storage.section)
    )


def consumer_client(
    connection: Connection, hub: str, consumer_group: str, store: BlobCheckpointStore
) -> EventHubConsumerClient:
    eventhub_idle.install()  # no partition owned: wait, do not spin (sandbox.functions.eventhub_idle)
    common: Dict[str, Any] = {
        "checkpoint_store": store,
        "load_balancing_strategy": LoadBalancingStrategy.GREEDY,
        "load_balancing_interval": LOAD_BALANCING_INTERVAL,
        "partition_ownership_expiration_interval": OWNERSHIP_EXPIRATION,
    }
    if connection.connection_string:
        parts = dict(p.split("=", 1) for p in connection.connection_string.split(";") if "=" in p)
        entity = parts.get("EntityPath")
        if entity and entity != hub:
            # The host lets EntityPath in the connection string win over eventHubName.
            log.warning(
                "connection %s names hub %r; binding names %r: using %r", connection.name, entity, hub, entity
            )
        return EventHubConsumerClient.from_connection_string(
            connection.connection_string, consumer_group, eventhub_name=None if entity else hub, **common
        )
    namespace = connection.section.get("fullyQualifiedNamespace")
    if not namespace:
        raise SettingsError(
            f"identity-based connection {connection.name} needs {connection.name}__fullyQualifiedNamespace"
        )
    return EventHubConsumerClient(
        namespace, hub, consumer_group, credential_for(connection.section), **common
    )


def application_properties(event: EventData) -> Dict[str, Any]:
    """An event's application properties as the host passes them (text keys; binary as text)."""
    def text(value: Any) -> Any:
        return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value

    return {str(text(k)): text(v) for k, v in (event.properties or {}).items()}


def function_events(events: List[EventData], many: bool) -> List[func.EventHubEvent]:
    """The events with the trigger metadata the host gives: for cardinality many one shared mapping
    whose `PropertiesArray[i]` is event i's application properties; for one, `Properties`."""
    props = [application_properties(e) for e in events]
    if many:
        shared = {"PropertiesArray": meta.Datum(json.dumps(props), "json")}
        return [to_function_event(e, shared) for e in events]
    return [to_function_event(e, {"Properties": meta.Datum(json.dumps(p), "json")})
            for e, p in zip(events, props)]


def to_function_event(event: EventData,
                      trigger_metadata: Optional[Dict[str, Any]] = None) -> func.EventHubEvent:
    body = event.body
    if not isinstance(body, (bytes, bytearray)):
        body = b"".join(body) if not isinstance(body, str) else body.encode("utf-8")
    key = event.partition_key
    return func.EventHubEvent(
        body=bytes(body),
        sequence_number=event.sequence_number,
        offset=str(event.offset),
        partition_key=key.decode("utf-8") if isinstance(key, bytes) else key,
        enqueued_time=event.enqueued_time,
        iothub_metadata=None,
        trigger_metadata=trigger_metadata,
    )


class EventHubTrigger:
    """One function's Event Hubs trigger: receive_batch on every partition, invoke, then checkpoint."""

    def __init__(
        self,
        spec: FunctionSpec,
        settings: AppSettings,
        options: EventHubOptions,
        retry: RetryPolicy,
        stop: threading.Event,
    ) -> None:
        trigger = spec.trigger
        self.spec = spec
        self.hub = str(settings.resolve(trigger["eventHubName"]))
        self.consumer_group = str(settings.resolve(trigger.get("consumerGroup") or "$Default"))
        self.many = str(trigger.get("cardinality", "many")).lower() == "many"
        self.options = options
        self.retry = retry
        self.stop = stop
        self.connection = settings.connection(str(trigger.get("connection") or "EventHubConnection"))
        self.client = consumer_client(
            self.connection, self.hub, self.consumer_group, checkpoint_store(settings)
        )
        self.batches_since_checkpoint: Dict[str, int] = {}
        # minEventBatchSize > 1: events held per partition until there are enough or maxWaitTime passed
        self.batchers: Dict[str, PartitionBatcher] = {}
        self.thread: Optional[threading.Thread] = None

    def describe(self) -> str:
        return (
            f"eventHubTrigger hub={self.hub!r} consumerGroup={self.consumer_group!r} "
            f"connection={self.connection.name}"
            f"({'identity' if self.connection.identity_based else 'string'}) "
            f"cardinality={'many' if self.many else 'one'} "
            f"maxEventBatchSize={self.options.max_event_batch_size}"
        )

    def start(self) -> None:
        self.thread = threading.Thread(target=self._receive, name=f"eventhub-{self.spec.name}", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.client.close()  # stops receiving and releases partition ownership
        for batcher in list(self.batchers.values()):
            batcher.close()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def _starting_position(self) -> Any:
        kind = self.options.initial_offset.lower()
        if kind == "fromend":
            return "@latest"
        if kind == "fromenqueuedtime" and self.options.initial_enqueued_time_utc:
            return datetime.fromisoformat(self.options.initial_enqueued_time_utc.replace("Z", "+00:00"))
        return "-1"  # fromStart: the beginning of each partition without a checkpoint

    def _receive(self) -> None:
        try:
            self.client.receive_batch(
                on_event_batch=self._on_batch,
                on_error=self._on_error,
                on_partition_close=self._on_partition_close,
                max_batch_size=self.options.max_event_batch_size,
                prefetch=self.options.prefetch_count,
                starting_position=self._starting_position(),
                # no max_wait_time: events come as soon as read (the SDK would hold them for its own
                # window); maxWaitTime is the partition batcher's timer, as in the extension
            )
        except Exception:
            if not self.stop.is_set():
                log.exception("Event Hubs trigger %s stopped receiving", self.spec.name)

    def _on_error(self, context: Any, error: Exception) -> None:
        partition = getattr(context, "partition_id", None)
        log.warning(
            "Event Hubs trigger %s, partition %s: %s: %s",
            self.spec.name,
            partition,
            type(error).__name__,
            error,
        )

    def _on_partition_close(self, context: Any, reason: Any) -> None:
        batcher = self.batchers.get(context.partition_id)
        if batcher is not None:
            batcher.close()  # the extension clears its cache: the next owner reads them again

    def _on_batch(self, context: Any, events: List[EventData]) -> None:
        """The host's batching (sandbox.functions.batching): with minEventBatchSize > 1 a partition's
        events wait until there are that many or the first has waited maxWaitTime; batches of at most
        maxEventBatchSize."""
        if self.stop.is_set() or not events:
            return
        if self.options.min_event_batch_size <= 1:
            self._dispatch(context, events)
            return
        batcher = self.batchers.get(context.partition_id)
        if batcher is None:
            batcher = self.batchers[context.partition_id] = PartitionBatcher(
                self.options.min_event_batch_size, self.options.max_event_batch_size,
                self.options.max_wait_time, self._dispatch, self.stop)
        batcher.receive(context, events)

    def _dispatch(self, context: Any, events: List[EventData]) -> None:
        if not events or self.stop.is_set():
            return
        batch = function_events(events, self.many)
        argument = str(self.spec.trigger["name"])
        calls = [batch] if self.many else [[e] for e in batch]
        for call in calls:
            value = call if self.many else call[0]
            reason = (
                f"(null) partition={context.partition_id} events={len(call)} "
                f"sequence={call[0].sequence_number}..{call[-1].sequence_number}"
            )
            try:
                self.retry.run(
                    lambda v=value, r=reason: self.spec.invoke(r, **{argument: v}), self.stop, self.spec.name
                )
            except Stopped:
                return  # not checkpointed: redelivered after restart
            except Exception:  # noqa: BLE001 - retries used up: logged; the host checkpoints and moves on
                log.error(
                    "Functions.%s: batch abandoned after retries (partition %s, sequence %s..%s)",
                    self.spec.name,
                    context.partition_id,
                    call[0].sequence_number,
                    call[-1].sequence_number,
                )
        count = self.batches_since_checkpoint.get(context.partition_id, 0) + 1
        if count >= self.options.batch_checkpoint_frequency:
            context.update_checkpoint(events[-1])
            count = 0
        self.batches_since_checkpoint[context.partition_id] = count
