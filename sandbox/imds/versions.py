"""What each api-version knows: the valid versions and the event fields/types each one shows."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

SCHEDULED_EVENTS_VERSIONS: Tuple[str, ...] = (
    "2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01",
)

# /metadata/instance accepts its own (longer) list; these are the versions Microsoft documents.
INSTANCE_VERSIONS: Tuple[str, ...] = (
    "2017-03-01", "2017-04-02", "2017-08-01", "2017-10-01", "2017-12-01", "2018-02-01", "2018-04-02",
    "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04", "2019-08-01",
    "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15", "2020-09-01", "2020-10-01", "2020-12-01",
    "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01", "2021-08-01", "2021-10-01", "2021-11-01",
    "2021-11-15", "2021-12-13", "2022-02-01", "2022-03-01", "2022-07-01", "2022-08-01", "2022-09-01",
    "2022-11-01", "2023-07-01",
)

TOKEN_VERSIONS: Tuple[str, ...] = ("2018-02-01", "2019-08-01")

# /metadata/attested/document exists from 2018-10-01 (the IMDS article's field table).
ATTESTED_VERSIONS: Tuple[str, ...] = tuple(v for v in INSTANCE_VERSIONS if v >= "2018-10-01")

# The first api-version that shows each event type / optional field (ISO dates compare as strings).
EVENT_TYPE_SINCE: Dict[str, str] = {
    "Freeze": "2017-03-01", "Reboot": "2017-03-01", "Redeploy": "2017-03-01",
    "Preempt": "2017-11-01", "Terminate": "2019-01-01",
}
FIELD_SINCE: Dict[str, str] = {
    "Description": "2019-04-01", "EventSource": "2019-08-01", "DurationInSeconds": "2020-07-01",
}
BASE_FIELDS: Tuple[str, ...] = (
    "EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore",
)


def render_event(full: Dict[str, Any], version: str) -> Optional[Dict[str, Any]]:
    """The event as `version` shows it, or None when that version does not know its type.

    Our choice (the docs are silent): an older version omits an event of a type it predates
    rather than showing a type its clients cannot parse.
    """
    if version < EVENT_TYPE_SINCE.get(full["EventType"], "9999"):
        return None
    shown = {name: full[name] for name in BASE_FIELDS}
    for name, since in FIELD_SINCE.items():
        if version >= since and name in full:
            shown[name] = full[name]
    return shown
