"""Seeded random interleavings of ingest, timer and operator calls (holds and approves) over three
instances (and now and then two timers at once on threads), with instances killed at a random store,
queue or webhook call and replaced (a restart), checked after every step against issue 10's invariants:
never a budget overrun (beyond what an operator forced), never an approval enqueued after a hold was
answered unless the answer disclosed it, exactly one approval message per attempt; and at the end every
alert delivered at least once, each under its one idempotency key. `make fault` runs the long form."""

from __future__ import annotations

import json
import random
import threading
import zlib
from collections import Counter
from datetime import timedelta
from typing import Dict, List, Optional, Set

import pytest

from central.model.alert import Alert
from central.model.times import parse
from central.runtime.results import InvalidRequest
from central.runtime.webhook import idempotency_key

from ..central.conftest import Env, Hook
from ..central.factory import T0, Vm, body, event

POLICY = {
    "version": 1,
    "budgets": {"per-scale-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
    "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}],
}
STEPS = 140
SETTINGS = {"POLICY_JSON": json.dumps(POLICY), "APPROVAL_RESULT_TIMEOUT_SECONDS": "40",
            "APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS": "40",
            "STATUS_ALERT_MIN_SEVERITY": "info"}  # every status's alert: the most deliveries to check
DEFAULT_FLOOR = {k: v for k, v in SETTINGS.items() if k != "STATUS_ALERT_MIN_SEVERITY"}


class Crash(BaseException):
    """SIGKILL inside one process: nothing in central catches a BaseException."""


CRASHED = object()


class World:
    def __init__(self, env: Env, fleet_of, seed: int, crash_rate: float = 0.05,
                 settings: Optional[Dict[str, str]] = None) -> None:
        self.settings = SETTINGS if settings is None else settings
        self.env = env
        self.rng = random.Random(seed)  # noqa: S311 - reproducible interleavings
        self.crash_rate = crash_rate
        self.inst = fleet_of(3, **self.settings)
        self.crashes = 0
        self.disclosed: Dict[str, Set[str]] = {}  # held event -> messages the hold's answer said may go
        self.forced: Set[str] = set()  # events an operator approved (budgets do not bind an operator)
        self.vms = [Vm(f"{group}_{i}", scale_set=group) for group in ("web", "db") for i in range(3)]
        self.now = T0
        self.open: Dict[str, str] = {}  # vm name -> its open event id
        self.phase: Dict[str, str] = {}  # event id -> Scheduled | Started
        self.held: Dict[str, object] = {}  # event id -> when the hold was answered
        self.acted: Set[str] = set()  # message ids a VM acted on
        self.count = 0

    def owner(self, vm: Vm) -> int:
        return zlib.crc32(vm.vm_id.encode()) % 3

    def tick(self) -> None:
        self.now += timedelta(seconds=self.rng.randint(1, 6))

    def arm(self, i: int):
        """Maybe kill instance i at its k-th store transaction, queue send or webhook POST of this call;
        returns what disarms it."""
        if self.rng.random() >= self.crash_rate:
            return lambda: None
        svc = self.inst[i]
        target, name = self.rng.choice(
            [(svc.state.store, "transact"), (svc.actor.sender, "send"), (svc.actor.alerter, "send")]
        )
        real, countdown = getattr(target, name), [self.rng.randint(1, 3)]

        def maybe_die(*args, **kwargs):
            countdown[0] -= 1
            if countdown[0] <= 0:
                raise Crash
            return real(*args, **kwargs)

        setattr(target, name, maybe_die)
        return lambda: setattr(target, name, real)

    def call(self, i: int, fn: str, *args, **kwargs):
        """One call on instance i; a crash replaces it with a fresh instance (nothing of its memory kept)
        and answers CRASHED."""
        disarm = self.arm(i)
        try:
            return getattr(self.inst[i], fn)(*args, **kwargs)
        except Crash:
            self.crashes += 1
            self.inst.all[i] = self.env.service(**self.settings)
            return CRASHED
        finally:
            disarm()

    def send(self, vm: Vm, envelopes: List[dict]) -> None:
        """Event Hubs delivers a batch until a call returns (the checkpoint moves only then): a crashed
        batch goes again to the partition's restarted owner."""
        bodies = [body(e) for e in envelopes]
        for _ in range(10):
            if self.call(self.owner(vm), "handle_batch", bodies, now=self.now) is not CRASHED:
                return
        raise AssertionError("a batch crashed ten times in a row")

    def step(self) -> None:
        self.tick()
        roll = self.rng.random()
        vm = self.rng.choice(self.vms)
        if roll < 0.3 and vm.name not in self.open:
            self.count += 1
            eid = f"E-{self.count:03d}"
            self.open[vm.name] = eid
            self.phase[eid] = "Scheduled"
            ev = event(eid, [vm.name], not_before=self.now + timedelta(hours=2))
            self.send(vm, [vm.heartbeat(at=self.now), vm.incarnation_env([ev], at=self.now)])
        elif roll < 0.45:
            self.vm_acts(vm)
        elif roll < 0.55:
            self.send(vm, [vm.heartbeat(at=self.now)])
        elif roll < 0.6 and self.open:
            eid = self.rng.choice(sorted(self.open.values()))
            if self.phase[eid] == "Scheduled" and eid not in self.held:
                answer = self.call(self.rng.randrange(3), "decide", eid, "hold", "ops", "random hold",
                                   now=self.now)
                if answer is not CRASHED:  # answered: binding from now on
                    self.held[eid] = self.now
                    self.disclosed[eid] = {a["messageId"] for a in answer["approvals"]}
        elif roll < 0.64 and self.open:
            eid = self.rng.choice(sorted(self.open.values()))
            if self.phase[eid] == "Scheduled":
                # the approve may be committed even when a later step of the call crashes: from its
                # submission on, an approval is what the operator asked for (the hold no longer binds)
                self.forced.add(eid)
                self.held.pop(eid, None)
                try:
                    self.call(self.rng.randrange(3), "decide", eid, "approve", "ops", "go", now=self.now)
                except InvalidRequest:
                    pass  # an approval is outstanding, or no live leader
        elif roll < 0.7:
            a, b = self.rng.sample(range(3), 2)
            threads = [threading.Thread(target=self.call, args=(i, "reevaluate"), kwargs={"now": self.now})
                       for i in (a, b)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        else:
            self.call(self.rng.randrange(3), "reevaluate", now=self.now)

    def vm_acts(self, vm: Vm) -> None:
        """The VM's forwarder: approve on a valid message (result + Started), later the event goes."""
        eid = self.open.get(vm.name)
        if eid is None:
            return
        if self.phase[eid] == "Started":
            self.send(vm, [vm.heartbeat(at=self.now), vm.incarnation_env([], at=self.now)])
            del self.open[vm.name]
            return
        for msg in self.env.messages(vm.vm_id):
            if (
                msg["eventId"] == eid
                and msg["messageId"] not in self.acted
                and parse(msg["expiresAt"]) > self.now
            ):
                self.acted.add(msg["messageId"])
                started = dict(event(eid, [vm.name], status="Started"))
                self.send(
                    vm,
                    [
                        vm.result(eid, "approved", msg["messageId"], at=self.now),
                        vm.incarnation_env([started], at=self.now),
                    ],
                )
                self.phase[eid] = "Started"
                return

    # ---- invariants ---------------------------------------------------------------------------
    def check(self) -> None:
        rows = {r["EventId"]: r for r in self.env.rows("Events")}
        group_of = {vm.name: vm.scale_set for vm in self.vms}
        busy: Counter = Counter()
        forced: Counter = Counter()
        for row in rows.values():
            if row.get("Ended"):
                continue
            approvals = json.loads(row.get("Approvals") or "[]")
            outstanding = (
                approvals and approvals[-1]["result"] is None and parse(approvals[-1]["expiresAt"]) > self.now
            )
            if row["Status"] == "Started" or row["State"] == "approved" or outstanding:
                for name in json.loads(row["Resources"]):
                    busy[group_of[name]] += 1
                    forced[group_of[name]] += row["EventId"] in self.forced
        detail = [
            (r["EventId"], r["Status"], r["State"], r["Resources"], r.get("Approvals"), r.get("History"))
            for r in rows.values()
            if not r.get("Ended")
        ]
        assert all(n <= 1 + forced[g] for g, n in busy.items()), (
            f"budget overrun: {dict(busy)} (forced {dict(forced)}) at {self.now}: {detail}"
        )
        for vm in self.vms:
            messages = [m for m in self.env.messages(vm.vm_id)]
            ids = Counter(m["messageId"] for m in messages)
            assert all(c == 1 for c in ids.values()), "a message sent twice"
            for m in messages:
                row = rows[m["eventId"]]
                attempts = [a["messageId"] for a in json.loads(row["Approvals"])]
                assert m["messageId"] in attempts, "a message for no committed attempt"
                if m["eventId"] in self.held:
                    assert m["messageId"] in self.disclosed[m["eventId"]], (
                        "an approval enqueued after the hold was answered, not disclosed by its answer"
                    )
        for row in rows.values():
            attempts = [a["messageId"] for a in json.loads(row.get("Approvals") or "[]")]
            assert len(attempts) == len(set(attempts)), "two attempts share a message"


class ScaleSetPartitions(World):
    """The forwarder's partition key (a VM's scale set, issue 24): a scale set's envelopes reach one instance,
    which defers the changes the others make in the other set (central.policy.group_tags); a quarter of the
    batches reach another instance (partitions rebalance, an owner restarted)."""

    def owner(self, vm: Vm) -> int:
        home = zlib.crc32(vm.scale_set.encode()) % 3
        return self.rng.randrange(3) if self.rng.random() < 0.25 else home


def run_world(env: Env, hook: Hook, fleet_of, seed: int, steps: int, crash_rate: float = 0.05,
              settings: Optional[Dict[str, str]] = None, kind: type = World) -> World:
    world = kind(env, fleet_of, seed, crash_rate, settings)
    every_status = world.settings.get("STATUS_ALERT_MIN_SEVERITY") == "info"
    for _ in range(steps):
        world.step()
        world.check()
    for _ in range(3):  # quiet: every instance's timer, after every lease
        world.now += timedelta(seconds=90)
        for i in range(3):
            world.inst[i].reevaluate(now=world.now)
    world.check()
    delivered = hook.entries()
    keys = Counter(e["body"]["key"] for e in delivered)
    for entry in delivered:
        key = entry["body"]["key"]
        assert entry["idempotencyKey"] == idempotency_key(Alert(key, "", "", "", "", T0)), key
    for eid, phase in world.phase.items():
        assert keys[f"{eid}:Scheduled"] >= 1, f"{eid}: Scheduled alert never delivered"
        if phase == "Started" and every_status:
            assert keys[f"{eid}:Started"] >= 1, f"{eid}: Started alert never delivered"
    if not every_status:  # the default floor: nothing under warning posted, whoever crashed
        quiet = [e["body"]["key"] for e in delivered
                 if e["body"].get("kind") == "event-status" and e["body"].get("severity") == "info"]
        assert quiet == [], quiet
    rows = env.rows("Events")
    assert sum(int(r.get("PendingAlertCount") or 0) for r in rows) == 0, "alerts still owed"
    assert world.count >= 5 and any(r["Status"] == "Completed" for r in rows)
    print(
        f"seed={seed} steps={steps} events={world.count} holds={len(world.held)} operator approves="
        f"{len(world.forced)} crashes={world.crashes} approvals acted={len(world.acted)} "
        f"alerts delivered={len(delivered)} repeats={sum(c - 1 for c in keys.values())}"
    )
    return world


@pytest.mark.parametrize("seed", [3, 17])
def test_random_interleavings_keep_the_invariants(env: Env, hook: Hook, fleet_of, seed: int) -> None:
    # twice the long form's crash rate: the timers' threads make the walk not quite reproducible, and a
    # short walk of 140 steps must kill an instance whatever central's own store calls become
    world = run_world(env, hook, fleet_of, seed, STEPS, crash_rate=0.1)
    assert world.crashes >= 1, "the short form must kill at least one instance"


def test_random_interleavings_keep_the_invariants_with_the_default_alert_floor(
        env: Env, hook: Hook, fleet_of) -> None:
    """The same walk with STATUS_ALERT_MIN_SEVERITY at its default: alerts dropped at commit and settled at
    delivery under crashes and races still leave nothing owed, every Scheduled alert is delivered, and
    nothing under the floor is posted."""
    world = run_world(env, hook, fleet_of, 5, STEPS, crash_rate=0.1, settings=DEFAULT_FLOOR)
    assert world.crashes >= 1, "the short form must kill at least one instance"


@pytest.mark.parametrize("seed", [7, 29])
def test_random_interleavings_keep_the_invariants_with_scale_sets_routed(env: Env, hook: Hook, fleet_of,
                                                                          seed: int, monkeypatch) -> None:
    """The same walk with each scale set's VMs on one instance (now and then another): an instance catching
    up reads the changed events of the groups it decides in and defers the rest, yet no budget is passed."""
    from central.store.event_reads import EventReads

    deferred = [0]
    defer = EventReads._defer

    def counted(self, event_id, tags):  # type: ignore[no-untyped-def]
        deferred[0] += 1
        return defer(self, event_id, tags)

    monkeypatch.setattr(EventReads, "_defer", counted)
    world = run_world(env, hook, fleet_of, seed, STEPS, crash_rate=0.1, kind=ScaleSetPartitions)
    assert world.crashes >= 1, "the short form must kill at least one instance"
    # at least one: the walk is not quite reproducible (the timers' threads, where a crash lands), and a
    # short walk deferred 2 in one CI run (clock +400 d) against 3 or more elsewhere
    assert deferred[0] >= 1, "the walk must defer changes of the other scale set"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 120))
def test_random_interleavings_long_form(env: Env, hook: Hook, fleet_of, seed: int) -> None:
    run_world(env, hook, fleet_of, seed, 500)
