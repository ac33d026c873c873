"""Traffic control between a batch's tickers and its vLLM servers.

Layered bottom-up, importing nothing of ``app.batch`` (the ``traffic`` contract in
pyproject.toml): ``clock``; ``ticket``, ``halt``; ``admission``, ``budget``,
``holdback``, ``routing``, ``sampler`` (the limits' rules, what held tickers back, routing,
the ``/metrics`` reader); ``strategy``; ``gate``; ``chains``; ``limits`` (request count,
token budget and chain footprint as one); ``server`` (one server, and the set of them);
``client`` (the one client a ticker calls through); ``scheduler`` (which ticker starts when).
How admission went is recorded outside, from their plain state (app/recorder/).
"""
