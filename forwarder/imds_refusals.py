"""When to stop retrying: IMDS refusing the configured request is a misconfiguration, not an outage.

IMDS answers 400 to an api-version it does not serve (or a request it finds malformed), 404 to a path
that is not IMDS, 405 to a method it does not allow. The forwarder's requests are well-formed and
`config_rules.py` already refused unknown api-versions, so the same refusal again and again means the
URL or the version is wrong for this IMDS: `run` ends with EXIT_IMDS_REFUSES after LIMIT refusals in a
row (the daemon's backoff spaces them over ~15-30 s), instead of two warnings a second forever.
systemd (RestartPreventExitStatus) and run-forwarder.ps1 do not restart on it.
"""

from __future__ import annotations

from typing import Optional

from .exitcodes import IMDS_REFUSES as EXIT_IMDS_REFUSES  # noqa: F401 - re-exported for app.py

NON_HEALING = frozenset({400, 404, 405})
LIMIT = 5


def non_healing(status: Optional[int]) -> bool:
    return status in NON_HEALING


class RefusalCounter:
    """Counts consecutive non-healing refusals; any other outcome (an answer, an outage) resets it."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.count = 0

    def record(self, status: Optional[int]) -> bool:
        """One poll's outcome (`status` of a refusal, None for success or a transient fault).
        True when the limit is reached: stop."""
        self.count = self.count + 1 if non_healing(status) else 0
        return self.count >= self.limit
