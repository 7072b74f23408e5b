"""The answers as a Markdown table and a PNG plot (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Tuple

import matplotlib

matplotlib.use("Agg")  # before pyplot: render to files only
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from .questions import Stats


@dataclass
class Provenance:
    """Where the answers come from, so the summary and the figure stand alone."""

    source: str = "(unknown)"
    files: int = 0
    records: int = 0
    envelopes: int = 0
    duplicates: int = 0
    unreadable: int = 0
    invalid: int = 0
    first: str = ""  # the envelopes' own times (when the forwarders observed), UTC
    last: str = ""
    time_scale: float = 1.0  # simulated seconds per real second (the demo's IMDS clock: 5)

    def lines(self) -> List[str]:
        x = f"{self.time_scale:g}"
        scale = ("1 (real time)" if self.time_scale == 1 else
                 f"{x}x (a simulated clock, e.g. the demo's): durations are wall-clock seconds, Azure's "
                 f"are {x} "
                 f"times as long (a Reboot's 900 s of notice shows as {900 / self.time_scale:.0f} s)")
        return [f"Source: {self.source}",
                f"Time range: {self.first or '-'} to {self.last or '-'} (the envelopes' own times, UTC)",
                f"Envelopes: {self.envelopes} from {self.records} record(s) in {self.files} file(s); "
                f"{self.duplicates} duplicate(s) dropped, {self.unreadable} unreadable, "
                f"{self.invalid} invalid",
                f"Time scale: {scale}",
                "Unit: seconds throughout; n = events behind each figure"]


@dataclass
class Answers:
    notice: List[Stats]
    approval_lead: List[Stats]
    per_group_week: Dict[Tuple[str, str], int]
    group_by: str
    provenance: Provenance = field(default_factory=Provenance)


def _stats_table(title: str, rows: List[Stats]) -> List[str]:
    lines = [f"## {title}", "", "| event type | n (events) | median (s) | min (s) | max (s) |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {s.key} | {s.count} | {s.median:.0f} | {s.low:.0f} | {s.high:.0f} |" for s in rows]
    if not rows:
        lines.append("| (none) | 0 | | | |")
    return [*lines, ""]


def markdown(answers: Answers) -> str:
    lines = ["# Scheduled events: analysis of the Capture files", ""]
    lines += [f"- {line}" for line in answers.provenance.lines()] + [""]
    lines += _stats_table("Notice: first sighting -> NotBefore", answers.notice)
    lines += _stats_table("Approval lead: approval on the VM -> NotBefore", answers.approval_lead)
    lines += [f"## Events per group ({answers.group_by}) per ISO week", "",
              "| group | week | events |", "|---|---|---:|"]
    lines += [f"| {group} | {week} | {n} |" for (group, week), n in answers.per_group_week.items()]
    if not answers.per_group_week:
        lines.append("| (none) | | 0 |")
    return "\n".join(lines) + "\n"


def _stats_bars(axes: Any, rows: List[Stats], title: str) -> None:
    """Median bars in seconds, n over each; min-max whiskers only where there is more than one event."""
    keys = [s.key for s in rows]
    bars = axes.bar(keys, [s.median for s in rows], color="#4878a8")
    spread = [s for s in rows if s.count > 1]
    if spread:
        axes.errorbar([s.key for s in spread], [s.median for s in spread],
                      yerr=[[s.median - s.low for s in spread], [s.high - s.median for s in spread]],
                      fmt="none", ecolor="black", capsize=4)
    axes.bar_label(bars, labels=[f"n={s.count}" for s in rows], label_type="center", color="white")
    axes.set_title(title)
    axes.set_ylabel("seconds (median; whiskers min-max where n > 1)")
    axes.margins(y=0.15)


def figure(answers: Answers) -> Any:
    """The three panels under a header that says where the numbers come from (a matplotlib Figure)."""
    fig, (notice, lead, weekly) = plt.subplots(1, 3, figsize=(15, 5.5))
    _stats_bars(notice, answers.notice, "Notice before NotBefore")
    _stats_bars(lead, answers.approval_lead, "Approval lead before NotBefore")
    labels = [f"{group}\n{week}" for group, week in answers.per_group_week]
    weekly_bars = weekly.bar(labels, list(answers.per_group_week.values()), color="#d08040")
    weekly.bar_label(weekly_bars, labels=[f"n={n}" for n in answers.per_group_week.values()], padding=2)
    weekly.set_title(f"Events per group ({answers.group_by}) per week")
    weekly.set_ylabel("distinct events")
    weekly.yaxis.set_major_locator(MaxNLocator(integer=True))
    weekly.margins(y=0.15)
    p = answers.provenance
    fig.suptitle("\n".join(p.lines()[:4]), fontsize=8, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.87))
    return fig


def plot(answers: Answers, path: Path) -> None:
    fig = figure(answers)
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
