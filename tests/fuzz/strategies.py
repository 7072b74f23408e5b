"""Hypothesis strategies for the fuzz suite: IMDS documents, approval messages and envelopes, each as
valid (following the schema), near-valid (one field mutated) and hostile raw text.

Hostile inputs stay bounded (at most a few hundred KB, nesting a few thousand deep) so the whole
suite runs in well under a minute; the client-side caps on really huge bodies are tested in
tests/security/test_size_bounds.py.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List

from hypothesis import strategies as st

EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
STATUSES = ("Scheduled", "Started")
VM_NAMES = ("vm0", "vm1", "WestNO_0", "WestNO_1", "vmss_3")

# Characters that break naive code: NUL and controls, RTL override/marks, zero-width, BOM, emoji
# (astral plane), combining marks, quotes and backslashes.
ODD_CHARS = "\x00\x01\x1f\x7f\u202e\u202d\u200f\u200e\u200b\ufeff\U0001f4a9\U0001f600\u0301\"\\/'<>&%"
odd_text = st.text(alphabet=st.one_of(st.sampled_from(ODD_CHARS), st.characters(codec="utf-8")),
                   max_size=40)
plain_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


def rfc1123(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31))
not_before = st.one_of(
    st.just(""),
    moments.map(rfc1123),
    moments.map(lambda m: m.strftime("%Y-%m-%dT%H:%M:%SZ")),
)
event_ids = st.one_of(st.uuids().map(lambda u: str(u).upper()),
                      st.text(min_size=1, max_size=128, alphabet=st.characters(codec="utf-8")))
resource_names = st.one_of(st.sampled_from(VM_NAMES), st.text(min_size=1, max_size=64))


@st.composite
def valid_event(draw: Any, names: Any = resource_names) -> Dict[str, Any]:
    event: Dict[str, Any] = {
        "EventId": draw(event_ids),
        "EventStatus": draw(st.sampled_from(STATUSES)),
        "EventType": draw(st.sampled_from(EVENT_TYPES)),
        "ResourceType": "VirtualMachine",
        "Resources": draw(st.lists(names, max_size=6)),
        "NotBefore": draw(not_before),
    }
    # Optional fields, as older api-versions omit them.
    if draw(st.booleans()):
        event["Description"] = draw(st.text(max_size=200))
    if draw(st.booleans()):
        event["EventSource"] = draw(st.sampled_from(("Platform", "User")))
    if draw(st.booleans()):
        event["DurationInSeconds"] = draw(st.integers(min_value=-1, max_value=2**40))
    return event


@st.composite
def valid_document(draw: Any, names: Any = resource_names) -> Dict[str, Any]:
    events = draw(st.lists(valid_event(names), max_size=5, unique_by=lambda e: e["EventId"]))
    incarnation = draw(st.one_of(st.integers(min_value=0, max_value=2**53),
                                 st.from_regex(r"\A[0-9]{1,18}\Z")))
    return {"DocumentIncarnation": incarnation, "Events": events}


# Values of the wrong type, or out of range, for any field.
wrong_values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.just(-2), st.just(2**64), st.just("x" * 5000),
)


@st.composite
def near_valid_document(draw: Any) -> Dict[str, Any]:
    """A valid document with exactly one thing broken (or dropped, or added)."""
    doc = draw(valid_document())
    where = draw(st.sampled_from(("top", "top-drop", "event", "event-drop", "events")))
    if where == "top":
        doc[draw(st.sampled_from(("DocumentIncarnation", "Events")))] = draw(wrong_values)
    elif where == "top-drop":
        del doc[draw(st.sampled_from(("DocumentIncarnation", "Events")))]
    elif where == "events" or not doc["Events"]:
        doc["Events"] = draw(st.one_of(wrong_values, st.lists(wrong_values, min_size=1, max_size=3)))
    else:
        event = doc["Events"][draw(st.integers(0, len(doc["Events"]) - 1))]
        key = draw(st.sampled_from(sorted(event)))
        if where == "event-drop":
            del event[key]
        else:
            event[key] = draw(wrong_values)
    return doc


def _nest(depth: int, inner: str) -> str:
    return "[" * depth + inner + "]" * depth


@st.composite
def hostile_text(draw: Any) -> str:
    """Raw bodies no schema-following generator produces."""
    kind = draw(st.sampled_from((
        "many-events", "long-strings", "deep", "deep-inside", "wrong-top", "unicode", "duplicate-keys",
        "numbers", "nan", "garbage", "truncated",
    )))
    if kind == "many-events" and draw(st.integers(0, 19)) > 0:
        kind = "long-strings"  # 1000+ events cost ~0.2 s each to validate twice: keep them rare
    if kind == "many-events":
        count = draw(st.integers(995, 1010))  # around the schema's maxItems 1000
        event = {**draw(valid_event()), "Resources": ["vm0"]}
        return json.dumps({"DocumentIncarnation": 1,
                           "Events": [{**event, "EventId": f"e{i}"} for i in range(count)]})
    if kind == "long-strings":
        length = draw(st.integers(4000, 20_000))
        event = draw(valid_event())
        event[draw(st.sampled_from(("Description", "EventId", "NotBefore")))] = "\u202e" * length
        return json.dumps({"DocumentIncarnation": 1, "Events": [event]})
    if kind == "deep":
        return _nest(draw(st.integers(50, 5000)), draw(st.sampled_from(("", "1", '{"a":1}'))))
    if kind == "deep-inside":  # unknown properties are tolerated: nesting inside a valid document
        doc = draw(valid_document())
        deep = draw(st.integers(10, 3000))
        text = json.dumps(doc)
        return text[:-1] + f', "Extra": {_nest(deep, "null")}}}'
    if kind == "wrong-top":
        return json.dumps(draw(wrong_values))
    if kind == "unicode":
        doc = draw(valid_document())
        odd = draw(st.sampled_from((r"\ud800", r"\udfff", r"\ud83d", r"\u0000", "\u202e\u200f",
                                    "\U0001f4a9", r"\ud83d\udca9", "\ufeff", "\\u202e")))
        key = draw(st.sampled_from(("Description", "EventId", "Resources", "Extra")))
        event = draw(valid_event())
        placeholder = "@@ODD@@"
        event[key] = [placeholder] if key == "Resources" else placeholder
        doc["Events"] = [event]
        return json.dumps(doc, ensure_ascii=draw(st.booleans())).replace(placeholder, odd)
    if kind == "duplicate-keys":
        first, second = draw(wrong_values), draw(st.integers(0, 10))
        return (f'{{"DocumentIncarnation": {json.dumps(first)}, "Events": [], '
                f'"DocumentIncarnation": {second}, "Events": {json.dumps(draw(wrong_values))}}}')
    if kind == "numbers":
        number = draw(st.sampled_from(("1e400", "-1e400", "1e-400", "-0", "9" * 5000, "1.0",
                                       "18446744073709551616", "-1", "0x10", "01", "1E2")))
        field = draw(st.sampled_from(("DocumentIncarnation", "DurationInSeconds")))
        event = draw(valid_event())
        event["DurationInSeconds"] = 5
        text = json.dumps({"DocumentIncarnation": 1, "Events": [event]})
        if field == "DocumentIncarnation":
            return text.replace('"DocumentIncarnation": 1', f'"DocumentIncarnation": {number}', 1)
        return text.replace('"DurationInSeconds": 5', f'"DurationInSeconds": {number}', 1)
    if kind == "nan":
        literal = draw(st.sampled_from(("NaN", "Infinity", "-Infinity")))
        where = draw(st.sampled_from(("DocumentIncarnation", "DurationInSeconds", "Extra")))
        event = draw(valid_event())
        event["DurationInSeconds"] = 7
        event["Extra"] = 7
        text = json.dumps({"DocumentIncarnation": 3, "Events": [event]})
        if where == "DocumentIncarnation":
            return text.replace('"DocumentIncarnation": 3', f'"DocumentIncarnation": {literal}', 1)
        return text.replace(f'"{where}": 7', f'"{where}": {literal}', 1)
    if kind == "truncated":
        text = json.dumps(draw(valid_document()))
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return draw(st.one_of(odd_text, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))


imds_texts = st.one_of(
    valid_document().map(json.dumps),
    near_valid_document().map(json.dumps),
    hostile_text(),
)


# ---- approval messages --------------------------------------------------------------------------

APPROVAL_FIELDS = ("schemaVersion", "messageId", "eventId", "vmId", "vmName", "action", "decidedBy",
                   "reason", "issuedAt", "expiresAt")


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@st.composite
def approval_message(draw: Any, now: datetime, vm_ids: List[str], vm_names: List[str],
                     event_ids: List[str]) -> Dict[str, Any]:
    """A schema-valid message, its fields drawn around the fixed state (so many are approvable)."""
    issued = now + timedelta(seconds=draw(st.integers(-3600, 900)))
    expires = issued + timedelta(seconds=draw(st.integers(-60, 7200)))
    msg: Dict[str, Any] = {
        "schemaVersion": 1,
        "messageId": str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1)))),
        "eventId": draw(st.one_of(st.sampled_from(event_ids), event_ids_any)),
        "vmId": draw(st.one_of(st.sampled_from(vm_ids), st.uuids().map(str))),
        "vmName": draw(st.one_of(st.sampled_from(vm_names), st.text(min_size=1, max_size=30))),
        "action": "approve",
        "decidedBy": draw(st.sampled_from(("policy:default", "operator:alice"))),
        "reason": draw(st.text(max_size=50)),
        "issuedAt": iso(issued),
        "expiresAt": draw(st.one_of(st.just(iso(expires)),
                                    st.just(expires.astimezone(timezone(timedelta(hours=2))).isoformat()))),
    }
    if draw(st.integers(0, 2)) == 0:  # aimed: addressed right, for the approvable event, fresh
        msg.update(vmId=vm_ids[0], vmName=vm_names[0], eventId=event_ids[0], issuedAt=iso(now),
                   expiresAt=iso(now + timedelta(seconds=draw(st.integers(1, 900)))))
    if draw(st.booleans()):
        msg["incarnation"] = draw(st.integers(0, 100))
    return msg


event_ids_any = st.text(min_size=1, max_size=40)


@st.composite
def mutated_approval(draw: Any, base: Any) -> Dict[str, Any]:
    msg = dict(draw(base))
    how = draw(st.sampled_from(("drop", "wrong", "extra", "case")))
    key = draw(st.sampled_from(APPROVAL_FIELDS))
    if how == "drop":
        msg.pop(key, None)
    elif how == "wrong":
        msg[key] = draw(st.one_of(wrong_values, st.sampled_from((
            "", "2026-13-01T00:00:00Z", "not a date", "2026-01-01T00:00:00", "approve-now", 0, 2))))
    elif how == "extra":
        msg[draw(st.text(min_size=1, max_size=10))] = draw(wrong_values)
    else:
        if isinstance(msg.get(key), str):
            msg[key] = msg[key].upper() if draw(st.booleans()) else msg[key] + " "
    return msg


@st.composite
def hostile_approval_body(draw: Any, base: Any) -> Any:
    kind = draw(st.sampled_from(("deep", "huge", "dup", "nan", "bytes", "base64", "unicode", "garbage",
                                 "array", "empty")))
    msg = draw(base)
    text = json.dumps(msg)
    if kind == "deep":
        return '{"x": ' + "[" * draw(st.integers(50, 5000)) + "}"
    if kind == "huge":
        msg["reason"] = "\U0001f4a9" * draw(st.integers(1025, 200_000))
        return json.dumps(msg, ensure_ascii=draw(st.booleans()))
    if kind == "dup":  # a second eventId after the first: json keeps the last
        return text[:-1] + f', "eventId": {json.dumps(draw(event_ids_any))}}}'
    if kind == "nan":
        literal = draw(st.sampled_from(("NaN", "Infinity", "1.0", "1e0")))
        return text.replace('"schemaVersion": 1', f'"schemaVersion": {literal}')
    if kind == "bytes":
        return draw(st.one_of(st.just(text.encode("utf-8")), st.binary(max_size=100)))
    if kind == "base64":
        import base64
        encoded = base64.b64encode(text.encode()).decode()
        return draw(st.sampled_from((encoded, encoded[:-2], "!" + encoded, encoded + "\n")))
    if kind == "unicode":
        field = draw(st.sampled_from(("vmName", "eventId", "reason", "decidedBy")))
        return text.replace(f'"{field}": "', f'"{field}": "' + draw(st.sampled_from(
            (r"\ud800", r"\u0000", "\u202e", r"\ufeff", "\U0001f600"))), 1)
    if kind == "array":
        return json.dumps([msg])
    if kind == "empty":
        return draw(st.sampled_from(("", "   ", "{}", "null", "0")))
    return draw(odd_text)


# ---- envelopes ----------------------------------------------------------------------------------

VM_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _vm(name: str = "vm0", vm_id: str = VM_ID) -> Any:
    from forwarder.identity import VmIdentity

    return VmIdentity(vm_id, name, {"resourceId": f"/subscriptions/s/resourceGroups/rg/providers/"
                                                  f"Microsoft.Compute/virtualMachines/{name}"},
                      {"team": "blue"})


@st.composite
def valid_envelope(draw: Any) -> Dict[str, Any]:
    """An envelope built by the forwarder's own builders (so central sees what VMs really send)."""
    from forwarder import envelope
    from forwarder.diff import diff

    vm = _vm(draw(st.sampled_from(VM_NAMES)), draw(st.one_of(st.just(VM_ID), st.uuids().map(str))))
    at = iso(draw(moments).replace(tzinfo=timezone.utc))
    kind = draw(st.sampled_from(("incarnation", "quarantined", "heartbeat", "approvalresult")))
    if kind == "incarnation":
        before, doc = draw(st.one_of(st.none(), valid_document())), draw(valid_document())
        number = int(doc["DocumentIncarnation"])
        return envelope.incarnation(vm, number, draw(st.one_of(st.none(), st.integers(0, 100))),
                                    draw(st.booleans()), "2020-07-01", doc, diff(before, doc), at)
    if kind == "quarantined":
        raw = draw(st.text(max_size=100))
        return envelope.quarantined(vm, "2020-07-01", raw, [{"path": "/", "message": "not JSON"}],
                                    None, None, at)
    if kind == "heartbeat":
        return envelope.heartbeat(vm, "0.1.0", at, draw(st.one_of(st.none(), st.integers(0, 99))),
                                  draw(st.lists(st.text(max_size=10), max_size=3)),
                                  {"backlog": draw(st.integers(0, 10)), "dropped": 0}, {}, now=at)
    data = {"vm": vm.as_vm(), "eventId": draw(st.text(max_size=20)),
            "outcome": draw(st.sampled_from(("approved", "rejected", "hook-failed", "post-failed"))),
            "reason": draw(st.text(max_size=40)), "messageId": None, "decidedBy": "policy:x", "at": at}
    return envelope.approval_result(vm, data)


def _paths(obj: Any, prefix: tuple = ()) -> List[tuple]:
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += _paths(value, (*prefix, i))
    return found


@st.composite
def mutated_envelope(draw: Any) -> Dict[str, Any]:
    """A valid envelope with one value anywhere in it replaced, or one key dropped."""
    env = json.loads(json.dumps(draw(valid_envelope())))
    path = draw(st.sampled_from(_paths(env)[1:]))
    parent = env
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(st.one_of(wrong_values, st.sampled_from((
            "", "2026-99-99T00:00:00Z", "scheduledevents.other.v1", "0.9", "text/plain"))))
    return env


@st.composite
def hostile_envelope_body(draw: Any) -> Any:
    kind = draw(st.sampled_from(("deep", "huge", "dup", "nan", "bytes", "unicode", "garbage", "wrong-top",
                                 "partitionkey", "time")))
    env = draw(valid_envelope())
    text = json.dumps(env)
    if kind == "deep":
        return "[" * draw(st.integers(50, 5000))
    if kind == "huge":
        env["data"]["padding"] = "\u202e" * draw(st.integers(10_000, 300_000))
        return json.dumps(env, ensure_ascii=draw(st.booleans()))
    if kind == "dup":
        return text[:-1] + f', "type": {json.dumps(draw(st.text(max_size=30)))}}}'
    if kind == "nan":
        literal = draw(st.sampled_from(("NaN", "Infinity")))
        return text.replace('"specversion": "1.0"', f'"specversion": {literal}')
    if kind == "bytes":
        return draw(st.one_of(st.just(text.encode("utf-8")), st.binary(max_size=200),
                              st.just(text.encode("utf-16"))))
    if kind == "unicode":
        return text.replace('"subject": "', '"subject": "' + draw(st.sampled_from(
            (r"\ud800", r"\u0000", "\u202e", "\U0001f600"))), 1)
    if kind == "wrong-top":
        return json.dumps(draw(wrong_values))
    if kind == "partitionkey":
        env["partitionkey"] = draw(st.text(min_size=1, max_size=40))
        return json.dumps(env)
    if kind == "time":
        env["time"] = draw(st.sampled_from(("2026-02-30T00:00:00Z", "yesterday", "2026-01-01T25:00:00Z",
                                            "2026-01-01T00:00:00+99:00")))
        return json.dumps(env)
    return draw(odd_text)


envelope_bodies = st.one_of(
    valid_envelope().map(json.dumps),
    mutated_envelope().map(json.dumps),
    hostile_envelope_body(),
)


def mutate_document(doc: Dict[str, Any], rnd: Any) -> Dict[str, Any]:
    """One field of a (deep-copied) valid document broken, dropped or replaced, chosen by `rnd`
    (hypothesis' seeded Random): cheap near-valid variants, several per drawn document."""
    doc = json.loads(json.dumps(doc))
    bad = rnd.choice([None, True, -1, -2, 2**64, 1.5, 0.0, "", "x" * 5000, "Scheduled", [], {}, [1], "-1",
                      "1" * 19, "Mon, 32 Apr 2022 22:26:58 GMT", "2022-04-11 22:26:58", "Completed"])
    where = rnd.choice(("top", "top-drop", "event", "event-drop", "events", "extra"))
    if where == "top":
        doc[rnd.choice(("DocumentIncarnation", "Events"))] = bad
    elif where == "top-drop":
        del doc[rnd.choice(("DocumentIncarnation", "Events"))]
    elif where == "extra":
        doc[rnd.choice(("Extra", "documentincarnation", ""))] = bad
    elif where == "events" or not doc["Events"]:
        doc["Events"] = rnd.choice([bad, [bad], [bad, bad]])
    else:
        event = rnd.choice(doc["Events"])
        key = rnd.choice(sorted(event))
        if where == "event-drop":
            del event[key]
        else:
            event[key] = bad
    return doc
