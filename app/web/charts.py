"""Draw the pages' plots on the server as inline SVG (matplotlib): nothing for a browser to fetch.

Only the object-oriented API is used (a fresh ``Figure`` per plot, never pyplot's global
state), so plots can be drawn from the web server's worker threads at the same time.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

RATING_COLOURS = {
    "Buy": "#1a7f37",
    "Overweight": "#6cc24a",
    "Hold": "#9a9a9a",
    "Underweight": "#f0883e",
    "Sell": "#cf222e",
}
LINE_COLOURS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#57606a")

# Typed loosely: matplotlib types rcParams keys as one long Literal.
STYLE: dict[Any, Any] = {
    "svg.fonttype": "none",  # text stays text: smaller, selectable, styled by the page
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e5e5e5",
    "grid.linewidth": 0.6,
}


@dataclass(frozen=True)
class Series:
    """One line of a time plot: its label, x values (seconds) and y values."""

    label: str
    x: Sequence[float]
    y: Sequence[float]


def _svg(fig: Figure, chart_id: str) -> str:
    buffer = io.StringIO()
    # The salt makes each plot's generated ids (clip paths) its own when several share a page.
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": chart_id}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    # Inline in HTML: drop the XML prolog and DOCTYPE, keep the <svg> element.
    text = text[text.index("<svg"):]
    return re.sub(r"<svg ", f'<svg role="img" aria-label="{chart_id}" ', text, count=1)


@contextmanager
def _plot(width: float, height: float) -> Iterator[tuple[Figure, Axes]]:
    """Yield a fresh figure and its one Axes, made and drawn in the pages' style."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height), layout="constrained")
        yield fig, fig.add_subplot()


def rating_bars(counts: dict[str, int], chart_id: str = "ratings") -> str:
    """Draw how many tickers got each rating, one coloured bar per rating, best first."""
    with _plot(4.2, 1.9) as (fig, ax):
        names = list(RATING_COLOURS)
        values = [counts.get(name, 0) for name in names]
        bars = ax.barh(names[::-1], values[::-1], color=[RATING_COLOURS[n] for n in names][::-1])
        for name, patch in zip(names[::-1], bars.patches, strict=True):
            patch.set_gid(f"{chart_id}-{name}")
        ax.bar_label(bars, padding=2)
        ax.set_xlabel("tickers")
        ax.grid(axis="y", visible=False)
        ax.set_xlim(0, max([*values, 1]) * 1.15)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        return _svg(fig, chart_id)


def history(points: Sequence[tuple[date, float, str]], chart_id: str = "history") -> str:
    """Draw a ticker's score night by night, each point coloured by that night's rating."""
    with _plot(6.4, 2.3) as (fig, ax):
        days = date2num([p[0] for p in points])
        scores = [p[1] for p in points]
        (line,) = ax.plot(days, scores, color="#57606a", linewidth=1, zorder=1)
        line.set_gid(f"{chart_id}-line")
        dots = ax.scatter(days, scores, c=[RATING_COLOURS.get(p[2], "#000") for p in points],
                          s=28, zorder=2)
        dots.set_gid(f"{chart_id}-points")
        ax.axhline(0, color="#999", linewidth=0.6)
        ax.set_ylim(-1.05, 1.05)
        ax.set_ylabel("score")
        ax.xaxis_date()
        if len(points) <= 12:  # few nights: label each one
            ax.set_xticks(days, labels=[p[0].strftime("%b %d") for p in points])
            ax.set_xlim(days[0] - 0.5, days[-1] + 0.5)
        else:
            locator = AutoDateLocator(maxticks=8)
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        return _svg(fig, chart_id)


def ic_track(days: Sequence[date], ics: Sequence[float], means: Sequence[float],
             lows: Sequence[float | None], highs: Sequence[float | None], *,
             chart_id: str) -> str:
    """Draw each night's rank IC as a dot and the running mean IC with its band."""
    with _plot(6.4, 2.5) as (fig, ax):
        x = date2num(list(days))
        dots = ax.scatter(x, ics, s=10, color="#9a9a9a", label="IC of the night", zorder=2)
        dots.set_gid(f"{chart_id}-nights")
        band = [(d, lo, hi) for d, lo, hi in zip(x, lows, highs, strict=True)
                if lo is not None and hi is not None]
        if band:
            fill = ax.fill_between([b[0] for b in band], [b[1] for b in band],
                                   [b[2] for b in band], color="#0969da", alpha=0.18,
                                   linewidth=0, label="95% band of the mean")
            fill.set_gid(f"{chart_id}-band")
        (line,) = ax.plot(x, means, color="#0969da", linewidth=1.5, label="running mean IC",
                          zorder=3)
        line.set_gid(f"{chart_id}-mean")
        ax.axhline(0, color="#57606a", linewidth=0.8)
        ax.set_ylabel("rank IC")
        ax.xaxis_date()
        locator = AutoDateLocator(maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        ax.legend(loc="best", frameon=False)
        return _svg(fig, chart_id)


def time_lines(series: Sequence[Series], *, ylabel: str, chart_id: str,
               xlabel: str = "seconds since the batch started", percent: bool = False,
               step: bool = False) -> str:
    """Draw one or more lines over time, e.g. running and waiting requests, or KV usage."""
    with _plot(6.4, 2.3) as (fig, ax):
        for i, s in enumerate(series):
            colour = LINE_COLOURS[i % len(LINE_COLOURS)]
            if step:  # a gauge holds its value until the next reading
                (line,) = ax.step(s.x, s.y, where="post", label=s.label, linewidth=1.3,
                                  color=colour)
            else:
                (line,) = ax.plot(s.x, s.y, label=s.label, linewidth=1.3, color=colour)
            line.set_gid(f"{chart_id}-{i}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if percent:
            ax.set_ylim(0, 1.02)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        else:
            ax.set_ylim(bottom=0)
        if len(series) > 1:
            ax.legend(loc="best", frameon=False)  # where it hides the fewest points
        return _svg(fig, chart_id)


def node_latency(names: Sequence[str], means: Sequence[float], p99s: Sequence[float],
                 chart_id: str = "latency") -> str:
    """Draw each node's mean latency as a bar with its p99 as a tick, nodes in graph order."""
    with _plot(6.4, 0.9 + 0.18 * len(names)) as (fig, ax):
        rows = list(range(len(names)))[::-1]
        bars = ax.barh(rows, means, color="#0969da", label="mean")
        for name, patch in zip(names, bars.patches, strict=True):
            patch.set_gid(f"{chart_id}-{name}")
        ax.scatter(p99s, rows, marker="|", s=80, color="#cf222e", label="p99", zorder=3)
        ax.set_yticks(rows, labels=list(names))
        ax.set_xlabel("seconds per call")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False)
        return _svg(fig, chart_id)
