"""Turn a batch's (or several arms') series into the SVG plots its page shows."""

from __future__ import annotations

from urllib.parse import urlsplit

from app.morning.accounting import Arm
from app.morning.series import Gauges
from app.morning.views import BatchView, CompareView
from app.web import charts
from app.web.charts import Series


def _short(endpoint: str | None) -> str:
    """Name an endpoint by its host and port (its /v1 path is the same on every one)."""
    if endpoint is None:
        return "server"
    return urlsplit(endpoint).netloc or endpoint


def _rates(label: str, s: Gauges) -> Series:
    """Return a series' tok/s between readings, the last rate held to its last reading."""
    return Series(label, [*s.tok_s_t, s.t[-1]], [*s.tok_s, s.tok_s[-1]])


def batch_plots(view: BatchView) -> dict[str, str | None]:
    """Return the batch page's plots; a plot without data is None (the page says so).

    With several endpoints the batch's lines (summed; KV the fullest endpoint's) come first,
    then each endpoint's own.
    """
    s = view.series
    nodes = view.report.nodes
    mean_tok_s = view.report.output_tokens_per_s
    each = s.endpoints if len(s.endpoints) > 1 else []
    throughput = [
        _rates("between readings" if not each else "all endpoints", s),
        Series(f"batch mean {mean_tok_s:.1f}", [s.t[0], s.t[-1]], [mean_tok_s, mean_tok_s]),
        *(_rates(_short(e.endpoint), e) for e in each if e.tok_s)] if s.tok_s else []
    concurrency = [Series("running", s.t, s.running),
                   Series("waiting", s.t, s.waiting)] + [
        Series(f"running at {_short(e.endpoint)}", e.t, e.running) for e in each]
    kv = [Series("KV cache usage" if not each else "fullest endpoint", s.t, s.kv)] + [
        Series(_short(e.endpoint), e.t, e.kv) for e in each]
    return {
        "throughput": charts.time_lines(throughput, ylabel="output tokens/s",
                                        chart_id="throughput", step=True) if throughput else None,
        "concurrency": charts.time_lines(concurrency, ylabel="requests",
                                         chart_id="concurrency", step=True) if s.t else None,
        "kv": charts.time_lines(kv, ylabel="KV cache used", chart_id="kv", percent=True,
                                step=True) if s.t else None,
        "latency": charts.node_latency([n.node for n in nodes], [n.mean_s for n in nodes],
                                       [n.p99_s for n in nodes]) if nodes else None,
    }


def compare_plots(view: CompareView) -> dict[str, str | None]:
    """Return the arms' gauges over time, one line per arm, on shared axes."""
    arms = view.arms
    series = view.series

    def name(a: Arm) -> str:
        return f"#{a.batch_id} {a.label or a.kind}"

    has_samples = any(series[a.batch_id].t for a in arms)
    if not has_samples:
        return {"throughput": None, "concurrency": None, "kv": None}
    return {
        "throughput": charts.time_lines(
            [Series(name(a), series[a.batch_id].tok_s_t, series[a.batch_id].tok_s)
             for a in arms], ylabel="output tokens/s", chart_id="cmp-throughput", step=True),
        "concurrency": charts.time_lines(
            [Series(name(a), series[a.batch_id].t, series[a.batch_id].running)
             for a in arms], ylabel="running requests", chart_id="cmp-running", step=True),
        "kv": charts.time_lines(
            [Series(name(a), series[a.batch_id].t, series[a.batch_id].kv)
             for a in arms], ylabel="KV cache used", chart_id="cmp-kv", percent=True,
            step=True),
    }
