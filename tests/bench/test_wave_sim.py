"""bench.wave_sim on a small wave, both ways the SDKs reach the stand-in (requests' whole session, or its
per-request preparation skipped; tests/bench/test_table_memory.py holds both to Azurite's answers): every
event decided, approved and ended, none approved twice, no budget passed. (Calls and requests differ from
run to run: a call's virtual duration includes the CPU it used.)"""

from __future__ import annotations

import argparse

import pytest

from bench import table_memory_net
from bench.table_memory import MemoryStorage
from bench.table_model import Model
from bench.wave_sim import simulate


def small(http: str) -> argparse.Namespace:
    return argparse.Namespace(vms=1000, events=40, minutes=2.0, budget=5, instances=2, drain_minutes=30.0,
                              verbose=False, max_real_seconds=120.0, queues="installed", http=http)


@pytest.fixture(scope="module")
def runs() -> dict:
    return {http: simulate(small(http), table_memory_net.connection_string(), Model(), "t", MemoryStorage())
            for http in ("requests", "direct")}


@pytest.mark.parametrize("http", ["direct", "requests"])
def test_a_small_wave_is_played_to_the_end_within_its_budgets(runs: dict, http: str) -> None:
    r = runs[http]
    assert r["cut_at"] < 0 and r["decided"] == r["approved"] == r["ended"] == 40
    assert r["approved_twice"] == 0 and 0 < r["budget_peak"] <= 5
    # a lost race is safe (the commit plans again on re-read rows) and counted; the calls' virtual times come
    # from their measured CPU, so a loaded machine can make two instances' commits overlap (1 in a CI run)
    assert 0 <= r["lost_races"] <= 2
    assert r["requests"] > 0 and r["envelopes"] >= 40 * 4  # Scheduled, result, Started, gone at least


def test_the_overhead_diagnostic_serves_the_catch_up_without_requests() -> None:
    """bench.wave_overhead's third way: with two instances the catch-ups' rows come from the stand-in's
    memory (a count of them), and the wave is still played to the end; outside it, nothing is served."""
    from bench.wave_overhead import changes_free

    storage = MemoryStorage()
    every_set = argparse.Namespace(**{**vars(small("direct")), "route": "vm"})  # both decide in each set
    with changes_free(storage) as served:
        r = simulate(every_set, table_memory_net.connection_string(), Model(), "f", storage)
    assert served["rows"] > 0
    assert r["cut_at"] < 0 and r["decided"] == r["approved"] == r["ended"] == 40 and r["approved_twice"] == 0
    from central.store.vm_reads import VmReads

    assert VmReads.read_rows.__qualname__ == "VmReads.read_rows"  # put back


def test_the_phase_diagnostic_accounts_for_central_s_cpu_and_puts_the_functions_back() -> None:
    """bench.wave_phases: the phases' own CPU adds up to central's CPU in the calls (each second charged to
    one phase, the stand-in's answering to none); with two instances, records are built from the rows another
    instance changed (its catch-ups), with one, never (it reads back nothing it wrote); the wrapped functions
    are central's own again after the play."""
    from bench.wave_phases import REST, _phases, measure

    before = [owner.__dict__[name] for owner, name, _ in _phases()]
    every_set = argparse.Namespace(**{**vars(small("direct")), "route": "vm"})  # both decide in each set
    two, one = measure(every_set, 2, "p2"), measure(every_set, 1, "p1")
    for play in (two, one):
        total = play["figures"]["invocation_cpu_s"]
        assert abs(sum(play["cpu"].values()) - total) <= 0.05 * total + 0.01
        assert play["calls"][REST] == play["figures"]["calls"] - play["calls"]["the timer's pass"]
    assert two["calls"]["event records built"] > 0 and one["calls"].get("event records built", 0) == 0
    assert [owner.__dict__[name] for owner, name, _ in _phases()] == before


def test_routing_by_scale_set_puts_a_scale_set_on_one_partition() -> None:
    from bench.wave_sim import SCALE_SET_SIZE, SimVm

    by_vm = {SimVm(i, "vm").partition for i in range(SCALE_SET_SIZE)}
    by_set = {SimVm(i).partition for i in range(SCALE_SET_SIZE)}  # the forwarder's default
    assert len(by_vm) > 1 and len(by_set) == 1


def test_with_scale_sets_routed_each_instance_reads_fewer_of_the_others_changes(monkeypatch) -> None:
    """The forwarder's partition key (a VM's scale set) and the head's group tags: two instances, each
    deciding in the scale sets of its own partitions, read fewer changed events than when every VM is
    routed by its vmId (`--route vm`: every instance decides in every scale set); the wave is still played
    to the end, none approved twice, within its budget."""
    from bench.wave_phases import measure
    from central.store.event_reads import EventReads

    followed = {"events": 0}
    install = EventReads._install_active

    def counted(self, event_ids, found):  # type: ignore[no-untyped-def]
        event_ids = list(event_ids)
        followed["events"] += len(event_ids)
        return install(self, event_ids, found)

    monkeypatch.setattr(EventReads, "_install_active", counted)
    wave = argparse.Namespace(**{**vars(small("direct")), "vms": 3000})  # 6 scale sets: on both instances
    measure(argparse.Namespace(**{**vars(wave), "route": "vm"}), 2, "r0")
    by_vm, followed["events"] = followed["events"], 0
    routed = measure(wave, 2, "r1")
    assert followed["events"] < by_vm / 2
    r = routed["figures"]
    assert r["cut_at"] < 0 and r["decided"] == r["approved"] == r["ended"] == 40
    assert r["approved_twice"] == 0 and 0 < r["budget_peak"] <= 5
