"""Traffic control between a batch's tickers and its vLLM servers.

Layered bottom-up; a module imports only those listed before it (no cycles; the
``traffic`` contract in pyproject.toml holds it there), and nothing of ``app.batch``:

- ``tasks``, ``clock``, ``halt``, ``ticket``: waiting without stray tasks; the clock health
  is judged by; the one stop request; a ticker's place in line;
- ``admission``, ``budget``, ``holdback``, ``routing``, ``sampler``: the request count
  and KV token budget rules, what held tickers back, routing, and the ``/metrics`` reader;
- ``strategy``: what a strategy name means;
- ``gate``: requests held at the limits; ``chains``: the chain footprint measured there;
- ``limits``: request count, KV token budget and chain footprint as one object;
- ``server``: one server's reader, limits, gate and health; the set of servers of a batch;
- ``client``: the one client a ticker's graph calls through;
- ``scheduler``: which ticker starts when.
"""
