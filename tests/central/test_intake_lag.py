"""A backlog does not make live forwarders look silent (central/runtime/intake_lag.py): the fault suite's
finding, a Storage fault that left central behind the hub with the liveness shorter than the backlog, so
its decisions found no live forwarder and routed approvals around the VMs' hooks. CentralService on Azurite;
IntakeLag's rules on its own clock."""

from __future__ import annotations

from datetime import timedelta

from central.runtime.intake_lag import CAP, WINDOW, IntakeLag

from .conftest import Env, Hook
from .factory import T0, Vm, body, event


def test_a_backlog_is_judged_as_of_the_time_it_was_sent(env: Env, hook: Hook) -> None:
    """An event names vm-a and vm-r (the leader: the first live one, sorted). vm-a heartbeats 200 s before
    vm-r reports the event (liveness 300 s). Read 400 s late, vm-a is live as of what central has read and
    leads (by the wall clock it was silent for 600 s: before the fix vm-r led, and with no other VM, ARM).
    Control, read on time: vm-b heartbeats 400 s before vm-s reports, and is passed over (the lag widens
    the liveness, not the age of a heartbeat)."""
    sent_at = T0 + timedelta(seconds=1000)
    window = sent_at + timedelta(hours=1)
    svc = env.service()
    a, r = Vm("vm-a"), Vm("vm-r")
    sent = [sent_at - timedelta(seconds=200), sent_at - timedelta(seconds=200), sent_at]
    late = event("E-late", ["vm-r", "vm-a"], not_before=window)
    svc.handle_batch([body(a.heartbeat(at=sent[0])), body(r.heartbeat(at=sent[1])),
                      body(r.incarnation_env([late], at=sent[2]))],
                     now=sent_at + timedelta(seconds=400), enqueued_times=sent)
    assert [m["eventId"] for m in env.messages(a.vm_id)] == ["E-late"] and env.messages(r.vm_id) == []

    on_time = env.service()  # another instance, reading as the hub takes them (its lag is zero)
    b, s = Vm("vm-b"), Vm("vm-s")
    early = sent_at - timedelta(seconds=400)
    on_time.handle_batch([body(b.heartbeat(at=early))], now=early, enqueued_times=[early])
    silent = event("E-silent", ["vm-s", "vm-b"], not_before=window)
    on_time.handle_batch([body(s.heartbeat(at=sent_at)), body(s.incarnation_env([silent], at=sent_at))],
                         now=sent_at, enqueued_times=[sent_at, sent_at])
    assert env.messages(b.vm_id) == [] and [m["eventId"] for m in env.messages(s.vm_id)] == ["E-silent"]


def test_the_lag_is_the_largest_recent_one_and_expires() -> None:
    clock = [0.0]
    lag = IntakeLag(clock=lambda: clock[0])
    assert lag.allowance() == timedelta(0)
    lag.note(T0 + timedelta(seconds=400), [T0, T0 + timedelta(seconds=10)])  # the newest is 390 s old
    assert lag.allowance() == timedelta(seconds=390)
    clock[0] += 5
    lag.note(T0 + timedelta(seconds=400), [T0 + timedelta(seconds=399)])  # another partition, on time
    assert lag.allowance() == timedelta(seconds=390)  # does not hide the backlog
    clock[0] += WINDOW + 1
    assert lag.allowance() == timedelta(0)  # no batch for WINDOW: the wall clock again
    lag.note(T0 + timedelta(seconds=2), [T0 + timedelta(seconds=1)])
    assert lag.allowance() == timedelta(seconds=1)
    lag.note(T0 + timedelta(days=3), [T0])
    assert lag.allowance() == CAP
    lag.note(T0, [])  # an empty batch says nothing
    assert lag.allowance() == CAP
