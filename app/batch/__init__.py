"""Run many tickers' graphs on one event loop, paced by the server's own gauges."""
