"""Azure list prices (USD, pay-as-you-go) that bench.fleet_cost multiplies its counted units by, each
with where it was read and when, or, where no page could be found and cited, the assumption made.

Read 2026-11-25 with the session's search tools (stored copies of public pages). Prices are regional
and change: check the current pricing pages for your region before you commit to a budget. Free
grants (Functions: GB-s and executions per subscription; Log Analytics: 5 GB per billing account per
month) are NOT subtracted: the figures are what the pipeline adds to a subscription already using them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class Price:
    usd: float
    per: str
    source: str  # the page read (and its date), or "ASSUMED: why"


READ = "read 2026-11-25"

PRICES: Dict[str, Price] = {
    "eh_tu_hour": Price(
        0.03, "throughput unit-hour (Standard)",
        "github.com/infracost/infracost/issues/1354 (infracost's Azure price feed: a Standard TU at "
        f"$21.90/month = 730 h x $0.03), {READ}; Microsoft's page azure.microsoft.com/pricing/details/"
        "event-hubs renders its prices client-side and the stored copy holds none"),
    "eh_ingress_million": Price(
        0.028, "million ingress events (Standard; an event is 64 KB or less)",
        f"github.com/infracost/infracost/issues/1354 ($0.028 per 1M events), {READ}; 64 KB unit: "
        "azure.cn/en-us/pricing/details/event-hubs FAQ"),
    "eh_capture_tu_hour": Price(
        0.10, "Capture, per throughput unit-hour (Standard)",
        "ASSUMED from the ratio on azure.cn/en-us/pricing/details/event-hubs "
        f"(Capture 0.636 / TU 0.19 per hour = x3.35, {READ}) applied to the $0.03 TU-hour; no USD "
        "Capture price could be cited"),
    "fx_gb_s": Price(
        0.000026, "GB-s, Flex Consumption on demand",
        f"modal.com/blog/azure-function-pricing-guide (East US, 2025-05-22), {READ}; billing model "
        "(memory provisioned while an instance is executing): learn.microsoft.com/azure/azure-functions/"
        "functions-consumption-costs (Flex Consumption tab)"),
    "fx_million_exec": Price(
        0.40, "million executions, Flex Consumption on demand",
        "ASSUMED (the stored pricing pages show the meter without a figure; $0.40 per million is the "
        "Flex Consumption on-demand rate commonly quoted alongside $0.000026/GB-s)"),
    "table_10k": Price(
        0.00036, "10,000 Table transactions (Standard, LRS)",
        "ASSUMED (no stored copy of azure.microsoft.com/pricing/details/storage/tables with figures); "
        "a $batch (entity group transaction) counted as one transaction"),
    "queue_10k": Price(
        0.004, "10,000 Queue operations (Standard, LRS)",
        "ASSUMED, the same as docs/approvals.md (no price page with figures could be cited); some "
        "operation classes cost up to ~10x more, the line scales linearly"),
    "blob_10k": Price(
        0.065, "10,000 Blob operations, Hot, LRS (write class, used for every blob request)",
        "ASSUMED (no stored copy of the blob pricing page with figures); the write-class price is "
        "applied to reads too, so the line is an upper bound"),
    "la_gb": Price(
        2.30, "GB ingested, Log Analytics Analytics logs (Application Insights, workspace-based)",
        f"monitoringcost.com/azure-monitor-cost (~$2.30/GB, 5 GB/month free), {READ}; what counts "
        "(GB = 10^9 bytes; billed size from the stored columns, standard columns excluded): "
        "learn.microsoft.com/azure/azure-monitor/logs/cost-logs"),
}

# Application Insights records: billed bytes per record beside the message text. ASSUMED (no page gives
# a per-record size): the stored columns of AppTraces/AppRequests that Functions fills (Properties with
# Category, HostInstanceId, InvocationId, LogLevel, ProcessId; operation ids; AppRoleName/Instance;
# SDKVersion; ...) are several hundred bytes as text; cost-logs says billed size runs ~25 % under the
# JSON sent. 500 bytes per trace, 700 per request and 300 per metric row are used.
TRACE_RECORD_BYTES = 500
REQUEST_RECORD_BYTES = 700
METRIC_RECORD_BYTES = 300

HOURS_PER_MONTH = 730.0
