"""Serve the morning ranking, ticker pages and batch reports over HTTP (FastAPI + Jinja2)."""
