"""Opt-in Prometheus metrics on loopback: `metrics_port` > 0 serves http://127.0.0.1:<port>/metrics.

Off by default, and this module (with prometheus_client) is imported only when it is on. Loopback only:
a node exporter's textfile collector or a local agent scrapes it; nothing is exposed off the VM.
prometheus_client renders the exposition (and negotiates OpenMetrics when the scraper asks for it); the
values are read from the parts' own counters at each scrape, so nothing is counted twice.
Bounded cardinality: no label takes a value from IMDS or from a message (no event ids, no VM names);
the only labels are fixed words (`result`) and the build's version.
"""

from __future__ import annotations

import platform
import threading
import time
from typing import Any, Dict, Iterator, List, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector, CollectorRegistry

from . import __version__, logs

log = logs.get("metrics")
LOOPBACK = "127.0.0.1"

Sample = Tuple[str, str, str, List[Tuple[Dict[str, str], float]]]  # name, type, help, [(labels, value)]


def samples(app: Any, started: float) -> List[Sample]:
    """Every metric of the running forwarder, from the parts' own counters (pure reading)."""
    outbox = app.outbox.stats()
    health = app.client.health
    polls = app.poller.stats
    reader = getattr(app.approvals, "reader", None)
    queue = reader.stats if reader is not None else {}
    last_send = app.outbox.last_send_at
    g, c = "gauge", "counter"
    return [
        ("se_forwarder_build_info", g, "the running forwarder",
         [({"version": __version__, "python": platform.python_version()}, 1)]),
        ("se_forwarder_start_time_seconds", g, "when this process started (Unix time)", [({}, started)]),
        ("se_forwarder_outbox_backlog", g, "envelopes waiting in the outbox", [({}, outbox["backlog"])]),
        ("se_forwarder_outbox_dropped_total", c, "envelopes dropped because the outbox was full",
         [({}, outbox["dropped"])]),
        ("se_forwarder_outbox_last_send_timestamp_seconds", g, "last successful send (Unix time; 0: never)",
         [({}, last_send or 0)]),
        ("se_forwarder_outbox_send_failing", g, "1 while the last send failed",
         [({}, 1 if outbox["lastError"] else 0)]),
        ("se_forwarder_imds_requests_total", c, "IMDS requests made (each attempt)", [({}, health.requests)]),
        ("se_forwarder_imds_failures_total", c, "IMDS attempts without a 200/304", [({}, health.failures)]),
        ("se_forwarder_imds_retries_total", c, "IMDS attempts retried", [({}, health.retries)]),
        ("se_forwarder_polls_total", c, "scheduled-events polls by outcome",
         [({"result": "not_modified"}, polls["notModified"]), ({"result": "same_body"}, polls["sameBody"]),
          ({"result": "parsed"}, polls["parsed"])]),
        ("se_forwarder_last_incarnation", g, "the last DocumentIncarnation published (-1: none)",
         [({}, -1 if app.poller.last_incarnation is None else app.poller.last_incarnation)]),
        ("se_forwarder_scheduled_events", g, "events IMDS lists as Scheduled for this VM",
         [({}, len(app.poller.scheduled_event_ids()))]),
        ("se_forwarder_approval_queue_receives_total", c, "approval-queue receives (transactions)",
         [({}, queue.get("receives", 0))]),
        ("se_forwarder_approval_messages_total", c, "approval messages handled",
         [({}, queue.get("messages", 0))]),
        ("se_forwarder_approval_queue_errors_total", c, "approval-queue reads that failed",
         [({}, queue.get("errors", 0))]),
        ("se_forwarder_approval_poison_total", c, "approval messages set aside as poison",
         [({}, queue.get("poison", 0))]),
    ]


class ForwarderCollector(Collector):
    """Every metric of the running forwarder, read at each scrape."""

    def __init__(self, app: Any, started: float) -> None:
        self.app, self.started = app, started

    def collect(self) -> Iterator[Metric]:
        for name, kind, help_, values in samples(self.app, self.started):
            keys = sorted({k for labels, _ in values for k in labels})
            make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = make(name, help_, labels=keys)
            for labels, value in values:
                family.add_metric([labels.get(k, "") for k in keys], float(value))
            yield family


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes are not worth a log line each


class MetricsServer:
    """Serves /metrics on 127.0.0.1:`port` from a daemon thread until `close()` (other paths: 404)."""

    def __init__(self, app: Any, port: int) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ForwarderCollector(app, time.time()))
        metrics = make_wsgi_app(registry)

        def only_metrics(environ: dict, start_response: Any) -> Any:
            if environ.get("PATH_INFO") != "/metrics":
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"only /metrics\n"]
            return metrics(environ, start_response)

        self.httpd: WSGIServer = make_server(LOOPBACK, port, only_metrics, handler_class=_Quiet)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 1.0},
                                       name="metrics", daemon=True)
        self.thread.start()
        log.info(f"metrics on http://{LOOPBACK}:{self.port}/metrics")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
