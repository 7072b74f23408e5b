"""The IMDS client: scheduled events, instance compute metadata, and approvals (StartRequests).

Rules kept here (from the IMDS docs): `Metadata: true` on every request, never through a proxy
(environment proxy settings are ignored), never follow redirects, no X-Forwarded-For, a first call
that may take up to 2 minutes, retry with jittered backoff on 410 (for up to 70 s), 429, 5xx,
connection errors and timeouts, and at most 5 requests per second per VM, shared with
managed-identity token calls (forwarder/credential.py takes its slots from the same `RateLimiter`).
Conditional GETs (If-None-Match with the last ETag) when the caller passes one: IMDS may answer 304.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from .backoff import Backoff
from .clock import iso
from .imds_http import BodyTooLarge, ImdsHttp, TransportError
from .ratelimit import RateLimiter, RateLimitTimeout

DEFAULT_BASE_URL = "http://169.254.169.254"
DEFAULT_API_VERSION = "2020-07-01"
COMPUTE_API_VERSION = "2021-02-01"
SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
COMPUTE_PATH = "/metadata/instance/compute"

RETRY_STATUSES = frozenset({410, 429, 500, 502, 503, 504})
# Most bytes read from one IMDS answer. A real document is a few KB (a scale-set placement group's
# Resources list stays far below this) and an envelope must fit an Event Hubs message (1 MB), so a
# bigger body is never useful: it is refused unread instead of filling memory.
MAX_BODY_BYTES = 1024 * 1024
GONE_RETRY_SECONDS = 70.0  # the docs: retry a 410 for at most 70 s


class ImdsError(Exception):
    """Base of every IMDS client error."""


class ImdsUnavailable(ImdsError):
    """IMDS did not answer usefully (connection refused, timeouts, 410/429/5xx) within the retry budget.

    What to do: retry later (the daemon does). If it persists, check this is an Azure VM, that
    nothing blocks 169.254.169.254 (host firewall, a proxy that intercepts it), and `--imds-url`.
    """

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


class ImdsRejected(ImdsError):
    """IMDS refused the request (400/404/405, a redirect): retrying the same request will not help.

    What to do: check `--api-version` (IMDS lists the valid ones in the body), `--imds-url`, and
    for approvals that the EventId is one IMDS listed.
    """

    def __init__(self, message: str, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ImdsTooLarge(ImdsRejected):
    """IMDS answered a body larger than MAX_BODY_BYTES: not read further, not retried at once.

    What to do: nothing on the VM; a real IMDS never sends this much. Check `--imds-url` points at
    IMDS and nothing in between (a captive proxy, a misconfigured simulator) rewrites the answer.
    """


class ImdsStopped(ImdsError):
    """The client was asked to stop while waiting to retry."""


@dataclass
class ImdsResponse:
    status: int
    text: str
    url: str
    elapsed: float
    attempts: int
    headers: Dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class ImdsHealth:
    """What the heartbeat reports about IMDS."""

    requests: int = 0
    failures: int = 0
    retries: int = 0
    last_status: Optional[int] = None
    last_ok_at: Optional[float] = None
    last_error: Optional[str] = None

    def as_dict(self) -> Dict[str, Any]:
        return {"requests": self.requests, "failures": self.failures, "retries": self.retries,
                "lastStatus": self.last_status,
                "lastOkAt": iso(self.last_ok_at) if self.last_ok_at else None, "lastError": self.last_error}


class ImdsClient:
    """Talks to one VM's IMDS. Thread-safe enough for the daemon's workers (one session, one limiter).

    `base_url` is `http://169.254.169.254` in production; in the sandbox
    `http://127.0.0.1:N/vms/<name>`. `stop` (if given) interrupts retry waits on shutdown.
    """

    def __init__(self, base_url: str = DEFAULT_BASE_URL, api_version: str = DEFAULT_API_VERSION,
                 limiter: Optional[RateLimiter] = None, first_timeout: float = 120.0,
                 timeout: float = 5.0, connect_timeout: float = 3.0, retry_seconds: float = 30.0,
                 backoff_base: float = 0.25, backoff_cap: float = 4.0,
                 stop: Optional[threading.Event] = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_version = api_version
        self.limiter = limiter or RateLimiter()
        self.first_timeout = first_timeout
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry_seconds = retry_seconds
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.stop = stop
        self.health = ImdsHealth()
        self._answered = False  # until IMDS first answers, allow the long (2 min) first-call timeout
        self._http = ImdsHttp(self.base_url)
        self._lock = threading.Lock()

    # ---- public API -----------------------------------------------------------------------------

    def get_scheduled_events(self, etag: Optional[str] = None) -> ImdsResponse:
        """GET the scheduled-events document. `.text` is the raw body (the poller parses and validates
        it, so a malformed body can be quarantined verbatim).

        `etag`: the ETag of the last document seen; sent as If-None-Match, and a 304 answer (status 304,
        empty text) means the document has not changed. IMDS does not promise ETags: without one this
        is a plain GET. The live check before an approval never passes one (never a cached answer)."""
        headers = {"If-None-Match": etag} if etag else None
        return self.request("GET", SCHEDULED_EVENTS_PATH, self.api_version, headers=headers)

    def get_compute(self, api_version: str = COMPUTE_API_VERSION) -> Dict[str, Any]:
        """GET /metadata/instance/compute as a dict (identity and grouping of this VM)."""
        response = self.request("GET", COMPUTE_PATH, api_version)
        try:
            data = response.json()
        except ValueError as exc:
            raise ImdsUnavailable(f"IMDS compute metadata is not JSON ({exc}); retry later") from exc
        if not isinstance(data, dict):
            raise ImdsUnavailable("IMDS compute metadata is not a JSON object; retry later")
        return data

    def start_events(self, event_ids: Iterable[str]) -> ImdsResponse:
        """Approve (start) events now: POST {"StartRequests": [{"EventId": id}, ...]}.

        200 means IMDS accepted it (also when another VM already approved). Retried on 410/429/5xx:
        approving twice is harmless. Raises ImdsRejected on 400 (unknown/malformed EventId).
        """
        ids: List[str] = [str(e) for e in event_ids]
        if not ids:
            raise ValueError("start_events needs at least one EventId")
        body = {"StartRequests": [{"EventId": e} for e in ids]}
        return self.request("POST", SCHEDULED_EVENTS_PATH, self.api_version, json_body=body)

    def close(self) -> None:
        self._http.close()

    # ---- the one request loop -------------------------------------------------------------------

    def _sleep(self, seconds: float) -> None:
        if self.stop is not None:
            if self.stop.wait(seconds):
                raise ImdsStopped("stopping")
        else:
            time.sleep(seconds)

    def _timeout(self) -> tuple[float, float]:
        read = self.timeout if self._answered else self.first_timeout
        return (self.connect_timeout, read)

    def request(self, method: str, path: str, api_version: str,
                json_body: Optional[Dict[str, Any]] = None,
                headers: Optional[Dict[str, str]] = None) -> ImdsResponse:
        """One logical request, retried within the budget. Returns only 200 responses (and 304 when
        `headers` carry If-None-Match)."""
        ok = (200, 304) if headers and "If-None-Match" in headers else (200,)
        url = f"{self.base_url}{path}"
        started = time.monotonic()
        backoff = Backoff(base=self.backoff_base, cap=self.backoff_cap)
        attempts = 0
        gone_since: Optional[float] = None
        last = "no attempt"
        last_status: Optional[int] = None
        while True:
            attempts += 1
            try:
                slot = self.limiter.acquire(timeout=max(1.0, self.retry_seconds), stop=self.stop)
            except RateLimitTimeout as exc:
                if self.stop is not None and self.stop.is_set():
                    raise ImdsStopped("stopping") from exc
                raise ImdsUnavailable(f"{exc}; retry later") from exc
            t0 = time.monotonic()
            connect, read = self._timeout()
            try:
                answer = self._http.exchange(
                    method, path, {"api-version": api_version}, {"Metadata": "true", **(headers or {})},
                    None if json_body is None else json.dumps(json_body, allow_nan=False).encode(),
                    connect, read, MAX_BODY_BYTES)
                status, text = answer.status, answer.text
                self._record(status, None)
            except BodyTooLarge as exc:
                self._too_large(exc.status, method, url, str(exc))
            except TransportError as exc:
                answer, status, text = None, None, ""
                last = str(exc)[:300]
                self._record(None, last)
            finally:
                self.limiter.answered(slot)
            if status in ok:
                with self._lock:
                    self._answered = True
                    self.health.last_ok_at = time.time()
                return ImdsResponse(status=status, text=text, url=url, elapsed=time.monotonic() - t0,
                                    attempts=attempts, headers=answer.headers if answer else {})
            if status is not None:
                last_status = status
                last = f"HTTP {status}: {text[:200]}"
                if status not in RETRY_STATUSES:
                    with self._lock:
                        self._answered = True  # it answered, even if to refuse
                    raise ImdsRejected(self._rejected_message(method, url, api_version, status, text),
                                       status=status, body=text)
            now = time.monotonic()
            budget = self.retry_seconds
            if status == 410:
                gone_since = gone_since if gone_since is not None else now
                budget = max(budget, (gone_since - started) + GONE_RETRY_SECONDS)
            delay = backoff.next_delay()
            if now - started + delay > budget:
                raise ImdsUnavailable(
                    f"IMDS {method} {url} failed after {attempts} attempt(s) in {now - started:.1f}s "
                    f"(last: {last}). Retry later; if it persists check that this is an Azure VM, that "
                    f"nothing blocks 169.254.169.254, and --imds-url.", status=last_status)
            with self._lock:
                self.health.retries += 1
            self._sleep(delay)

    def _too_large(self, status: int, method: str, url: str, what: str) -> None:
        self._record(status, f"body too large ({what})")
        with self._lock:
            self._answered = True
        raise ImdsTooLarge(
            f"IMDS {method} {url} answered HTTP {status} with a body larger than the "
            f"{MAX_BODY_BYTES}-byte limit ({what}); not read. A real IMDS never sends this much: "
            f"check --imds-url and that nothing between this VM and IMDS rewrites answers.",
            status=status, body="")

    def _record(self, status: Optional[int], error: Optional[str]) -> None:
        with self._lock:
            self.health.requests += 1
            self.health.last_status = status
            if status not in (200, 304):
                self.health.failures += 1
                self.health.last_error = error or f"HTTP {status}"

    @staticmethod
    def _rejected_message(method: str, url: str, api_version: str, status: int, text: str) -> str:
        hint = {
            400: f"check --api-version ({api_version!r}) and, for approvals, the EventIds",
            404: "check --imds-url (the path is not an IMDS endpoint)",
            405: "the endpoint does not allow this method",
        }.get(status, "redirects are never followed; check --imds-url" if 300 <= status < 400
              else "not retried")
        return f"IMDS refused {method} {url}: HTTP {status} ({text[:200].strip()}); {hint}"


def managed_identity_credential(client_id: str, limiter: RateLimiter,
                                stop: Optional[threading.Event] = None) -> Any:
    """The VM's managed identity for the Azure SDKs (forwarder/credential.py): tokens from IMDS within
    its budget, never through a proxy."""
    from .credential import ManagedIdentityCredential

    return ManagedIdentityCredential(client_id, limiter, stop)
