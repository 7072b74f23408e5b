"""Changes to other groups' events left unread (issue 24): a cache behind the head reads what the head says
changed only for the events a decision may count (those its cached VM rows place in a group of what it
decides, or cannot place), the events it is given to plan, and the ones created or renamed; the rest is
read before anything else uses it. On 4 instances most of a call's catch-up was other instances' events in
other groups. On Azurite, two instances of the real service."""

from __future__ import annotations

from datetime import timedelta

from central.store import head_log

from .conftest import Env, Hook
from .factory import T0, Vm, body, event
from .test_freed_budgets import ONE_PER_SET, states


def test_a_decision_reads_the_changes_of_its_own_group_and_leaves_the_others(env: Env, hook: Hook) -> None:
    one, two = env.service(POLICY_JSON=ONE_PER_SET), env.service(POLICY_JSON=ONE_PER_SET)
    a, b, d = Vm("web-a", scale_set="web"), Vm("web-b", scale_set="web"), Vm("db-d", scale_set="db")
    # web-a's event is waiting on `two`'s cache (another web event holds the slot); db-d's is approved
    web0 = Vm("web-0", scale_set="web")
    one.handle_batch([body(web0.heartbeat()), body(web0.incarnation_env([event("E-0", ["web-0"])])),
                      body(a.heartbeat()), body(a.incarnation_env([event("E-a", ["web-a"])]))], now=T0)
    two.handle_batch([body(d.heartbeat()), body(d.incarnation_env([event("E-d", ["db-d"])]))], now=T0)
    assert states(two) == {"E-0": "approving", "E-a": "waiting-budget", "E-d": "approving"}
    # on `one`: E-0 ends, so E-a takes web's slot; db-d's event starts (reported to `one` this time)
    later = T0 + timedelta(seconds=30)
    freed = one.handle_batch([body(web0.incarnation_env([], later)),
                              body(d.incarnation_env([event("E-d", ["db-d"], status="Started")], later))],
                             now=later)
    assert [x.event_id for x in freed.decisions] == ["E-a"]
    # `two` decides a new web event: it must count E-a (approved since its cache read it), not read E-d
    new = later + timedelta(seconds=5)
    reports = [body(b.heartbeat(new)), body(b.incarnation_env([event("E-b", ["web-b"])], new))]
    result = two.handle_batch(reports, now=new)
    assert two.state.behind == {"E-d"} and two.state.active["E-d"][0].status == "Scheduled"
    assert [(x.event_id, x.action) for x in result.decisions] == [("E-b", "approve")]
    assert result.approvals_sent == 0 and not env.messages(b.vm_id)
    # anything that looks at every event reads it first (here: the operator's list)
    assert states(two)["E-b"] == "waiting-budget" and not two.state.behind  # E-a holds web's slot
    assert two.state.active["E-d"][0].status == "Started" and "E-0" not in two.state.active


def test_an_event_left_behind_is_read_when_it_is_found(env: Env, hook: Hook) -> None:
    one, two = env.service(POLICY_JSON=ONE_PER_SET), env.service(POLICY_JSON=ONE_PER_SET)
    d, w = Vm("db-d", scale_set="db"), Vm("web-w", scale_set="web")
    two.handle_batch([body(d.heartbeat()), body(d.incarnation_env([event("E-d", ["db-d"])]))], now=T0)
    later = T0 + timedelta(seconds=10)
    one.handle_batch([body(d.incarnation_env([event("E-d", ["db-d"], status="Started")], later))], now=later)
    new = later + timedelta(seconds=5)
    done = two.handle_batch([body(w.heartbeat(new)), body(w.incarnation_env([event("E-w", ["web-w"])], new))],
                            now=new)
    assert [x.event_id for x in done.decisions] == ["E-w"] and done.approvals_sent == 1
    assert two.state.behind == {"E-d"}  # another group's: not read for web's decision
    rec, active = two.state.find_event("E-d")  # (what planning a report of it asks)
    assert active and rec is not None and rec.status == "Started" and not two.state.behind


def test_the_head_names_the_events_a_commit_created_or_renamed() -> None:
    value = None
    for seq, ids in enumerate((["A"], [], ["B", "C"]), start=1):
        value = head_log.regrouped_appended(value, seq, ids, oldest=1)
    assert head_log.regrouped_since(value, 0, 3) == {"A", "B", "C"}
    assert head_log.regrouped_since(value, 1, 3) == {"B", "C"}
    assert head_log.regrouped_since(value, 3, 3) == set()
    assert head_log.regrouped_since(value, 0, 4) is None  # a commit it does not hold
    assert head_log.regrouped_since(None, 0, 3) is None  # a head rewritten without it: read everything
    # a head written by a version that kept no such log breaks the range: it starts again from the next commit
    restarted = head_log.regrouped_appended(None, 5, ["D"], oldest=1)
    assert head_log.regrouped_since(restarted, 4, 5) == {"D"}
    assert head_log.regrouped_since(restarted, 3, 5) is None
    trimmed = head_log.regrouped_appended(value, 4, ["E"], oldest=3)  # the change log dropped commits 1-2
    assert head_log.regrouped_since(trimmed, 2, 4) == {"B", "C", "E"}
    assert head_log.regrouped_since(trimmed, 1, 4) is None
