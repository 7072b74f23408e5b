"""The answers as a Markdown table and a PNG plot (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import matplotlib

matplotlib.use("Agg")  # before pyplot: render to files only
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from .questions import Stats


@dataclass
class Answers:
    notice: List[Stats]
    approval_lead: List[Stats]
    per_group_week: Dict[Tuple[str, str], int]
    group_by: str


def _stats_table(title: str, rows: List[Stats]) -> List[str]:
    lines = [f"## {title}", "", "| event type | events | median (s) | min (s) | max (s) |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {s.key} | {s.count} | {s.median:.0f} | {s.low:.0f} | {s.high:.0f} |" for s in rows]
    if not rows:
        lines.append("| (none) | 0 | | | |")
    return [*lines, ""]


def markdown(answers: Answers) -> str:
    lines = ["# Scheduled events: analysis of the Capture files", ""]
    lines += _stats_table("Notice: first sighting -> NotBefore", answers.notice)
    lines += _stats_table("Approval lead: approval on the VM -> NotBefore", answers.approval_lead)
    lines += [f"## Events per group ({answers.group_by}) per ISO week", "",
              "| group | week | events |", "|---|---|---:|"]
    lines += [f"| {group} | {week} | {n} |" for (group, week), n in answers.per_group_week.items()]
    if not answers.per_group_week:
        lines.append("| (none) | | 0 |")
    return "\n".join(lines) + "\n"


def plot(answers: Answers, path: Path) -> None:
    fig, (notice, lead, weekly) = plt.subplots(1, 3, figsize=(15, 4.5))
    for axes, rows, title in ((notice, answers.notice, "Notice before NotBefore"),
                              (lead, answers.approval_lead, "Approval lead before NotBefore")):
        keys = [s.key for s in rows]
        axes.bar(keys, [s.median / 60 for s in rows], color="#4878a8")
        below = [(s.median - s.low) / 60 for s in rows]
        above = [(s.high - s.median) / 60 for s in rows]
        axes.errorbar(keys, [s.median / 60 for s in rows], yerr=[below, above], fmt="none", ecolor="black",
                      capsize=4)
        axes.set_title(title)
        axes.set_ylabel("minutes (median, min-max)")
    labels = [f"{group}\n{week}" for group, week in answers.per_group_week]
    weekly.bar(labels, list(answers.per_group_week.values()), color="#d08040")
    weekly.set_title(f"Events per group ({answers.group_by}) per week")
    weekly.set_ylabel("distinct events")
    weekly.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
