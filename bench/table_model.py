"""A Table/Queue storage latency and throttling model in virtual time (bench.wave_sim's stand-in).

The requests themselves go to a Table/Queue service (the in-memory stand-in bench.table_memory
by default, or Azurite: ETags, conditional writes, `$batch`), through an azure-core transport that,
besides sending each one, charges its caller a *modelled* duration on a virtual clock instead of the
service's own. So the simulation measures what central's code does (how many round trips, which lose
races) at Azure's pace, not at this loaded 2-core machine's.

The model (documented in docs/sizing.md; the figures are assumptions unless cited there):
- latency per request: lognormal, median 6 ms, p99 ~40 ms for a point operation (same-region client);
  +0.1 ms per entity of a `$batch` (ASSUMED: no per-entity figure is published);
- targets (Microsoft's scalability targets, cited in docs/sizing.md): 2,000 entities/s per table
  partition, 20,000 requests/s per storage account. Each is a token bucket of one second's worth in
  virtual time; a request that finds its bucket empty is answered 503 (Server Busy), which the SDK
  retries after its backoff (modelled: 0.8 s, azure-core's first retry) and is counted as throttled.
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from central.runtime.settings import CountingTransport

MEDIAN_S = 0.006
SIGMA = 0.82  # lognormal shape: p99 = median * exp(2.326 * sigma) ~ 6.7 x median ~ 40 ms
PER_ENTITY_S = 0.0001
PARTITION_ENTITIES_PER_S = 2000.0
ACCOUNT_REQUESTS_PER_S = 20000.0
RETRY_BACKOFF_S = 0.8
_BATCH_TABLE = re.compile(r"(?:POST|PUT|PATCH|MERGE|DELETE) \S*/([A-Za-z][A-Za-z0-9]{2,62})[(\s?]")
_TABLE = re.compile(r"/([A-Za-z][A-Za-z0-9]{2,62})(?:\(|\?|$|/)")


@dataclass
class Bucket:
    rate: float
    tokens: float
    at: float = 0.0

    def take(self, now: float, n: float) -> float:
        """Tokens for `n` at virtual time `now`; the wait until there are enough (0: none)."""
        if now > self.at:
            self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = max(self.at, now)
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        wait = (n - self.tokens) / self.rate
        self.tokens = 0.0
        self.at += wait
        return wait


@dataclass
class Model:
    """Shared by every instance's transport: the account's and the partitions' buckets."""

    seed: int = 24
    use_measured: bool = False  # True: charge the service's own latency instead (the validation run)
    rng: random.Random = field(default_factory=random.Random)
    account: Bucket = field(default_factory=lambda: Bucket(ACCOUNT_REQUESTS_PER_S, ACCOUNT_REQUESTS_PER_S))
    partitions: Dict[str, Bucket] = field(default_factory=dict)
    throttled: int = 0
    samples: List[float] = field(default_factory=list)  # charged latencies, s
    measured: List[float] = field(default_factory=list)  # the service's own latencies (wall-clock), s

    def __post_init__(self) -> None:
        self.rng.seed(self.seed)

    def charge(self, now: float, partition: str, entities: int, measured: float) -> float:
        self.measured.append(measured)
        base = measured if self.use_measured else (
            MEDIAN_S * math.exp(SIGMA * self.rng.gauss(0.0, 1.0)) + PER_ENTITY_S * max(0, entities - 1))
        limit = PARTITION_ENTITIES_PER_S
        bucket = self.partitions.setdefault(partition, Bucket(limit, limit))
        wait = max(self.account.take(now, 1), bucket.take(now, max(1, entities)))
        if wait > 0:
            self.throttled += 1
            base += max(wait, RETRY_BACKOFF_S) + base  # the 503, the backoff, the retried request
        self.samples.append(base)
        return base


class ModelTransport(CountingTransport):
    """An instance's transport: sends to the service, charges `clock` (the instance's virtual seconds spent
    waiting on Storage in the current call) with the model's duration."""

    def __init__(self, model: Model, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.now = 0.0  # the virtual time the current call started at
        self.io = 0.0  # virtual Storage seconds charged in the current call

    def send(self, request: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        response = super().send(request, **kwargs)
        measured = time.perf_counter() - started
        body = request.body if isinstance(getattr(request, "body", None), (bytes, str)) else b""
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        batch = "$batch" in request.url
        entities = text.count("application/http") if batch else 1
        partition = partition_of(request.url)
        if batch:  # the table its operations name (one partition per transaction)
            found = _BATCH_TABLE.search(text)
            partition = found.group(1) if found else partition
        self.io += self.model.charge(self.now + self.io, partition, entities, measured)
        return response


def partition_of(url: str) -> str:
    """The partition a request lands on, as far as the model needs: the State table is one partition;
    each log table and each queue counts as one."""
    path = url.split("://", 1)[-1].split("/", 1)[-1]
    found: Optional[re.Match] = _TABLE.search("/" + path.split("/", 1)[-1]) if "/" in path else None
    return found.group(1) if found else path.split("?", 1)[0]
