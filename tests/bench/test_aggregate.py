"""`python -m bench` runs a benchmark 3 times and publishes the median [min-max] of each figure
(the team's standard: never one lucky draw). Pure functions, no benchmark is run here."""

from __future__ import annotations

from bench import Figure, aggregate, report, spread_figure
from bench.__main__ import modules, repeats_inside
from bench.report import markdown


def test_three_runs_become_one_median_with_its_range() -> None:
    runs = [Figure("b", "rate", v, "1/s", ">= 1000", v >= 1000) for v in (900.0, 1200.0, 1100.0)]
    (figure,) = aggregate(runs)
    assert (figure.value, figure.low, figure.high, figure.runs) == (1100.0, 900.0, 1200.0, 3)
    assert figure.met is True  # judged on the median, not on the unlucky run


def test_a_goal_missed_by_the_median_is_not_met() -> None:
    runs = [Figure("b", "latency", v, "s", "<= 3", v <= 3) for v in (2.9, 3.2, 3.4)]
    assert aggregate(runs)[0].met is False


def test_a_goal_without_a_bound_is_met_only_when_every_run_met_it() -> None:
    runs = [Figure("b", "approvals POSTed", v, "events", "20", v == 20) for v in (20, 19, 20)]
    assert aggregate(runs)[0].met is False


def test_figures_keep_their_order_and_a_single_run_stays_as_it_was() -> None:
    runs = [Figure("b", "x", 1.0, "u"), Figure("b", "y", 5.0, "u"), Figure("b", "x", 3.0, "u"),
            Figure("b", "x", 2.0, "u")]
    out = aggregate(runs)
    assert [(f.name, f.value, f.runs) for f in out] == [("x", 2.0, 3), ("y", 5.0, 1)]


def test_a_module_repeating_its_own_runs_is_run_once_and_reports_its_range() -> None:
    assert repeats_inside("central_throughput") and repeats_inside("forwarder_footprint")
    assert not repeats_inside("forwarder_latency")
    figure = spread_figure(Figure("central_throughput", "steady envelopes/s", 0, "1/s"), [4391, 4834, 4510])
    assert (figure.value, figure.low, figure.high, figure.runs) == (4510, 4391, 4834, 3)


def test_a_diagnostic_is_left_out_of_the_full_run() -> None:
    """`python -m bench` runs every module with a main() but the diagnostics (IN_BENCH = False)."""
    found = modules()
    assert "wave_sim" in found and "fleet_cost" in found
    assert "wave_overhead" not in found


def test_the_results_page_shows_median_range_and_runs() -> None:
    figure = aggregate([Figure("b", "rate", v, "1/s") for v in (10.0, 12.0, 11.0)])[0]
    page = markdown([figure], [], report.now(), 60.0, "python -m bench")
    assert "| b | rate | 11 | [10-12] | 3 | 1/s |" in page


def test_a_relative_goal_is_left_to_the_runs() -> None:
    """"<= 1.2 x one instance's" is not an absolute bound: the value (e.g. 48 round trips) is not
    compared with 1.2; every run must have met it."""
    runs = [Figure("b", "round trips", v, "requests", "<= 1.2 x one instance's", True) for v in (48, 50, 47)]
    assert aggregate(runs)[0].met is True
    runs = [Figure("b", "rate", v, "1/s", ">= 1.7 (offered)", None) for v in (100.0, 120.0, 90.0)]
    assert aggregate(runs)[0].met is True
