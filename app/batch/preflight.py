"""Refuse a batch that cannot work before any of its rows exist: the check every start runs.

Every start (``run``, ``run --as-of``, ``run --continue-night``, ``run --resume``, ``rerun``,
the scheduler daemon's fire) reaches ``check_start`` through app/batch/nightly.py once it
knows the batch's date and tickers, before the batch row is written. A refusal is one line,
exit 2 (InputError, ConfigError):

1. the market data: the date's snapshot exists and holds every ticker (a live provider:
   knows every ticker);
2. the server, with ``server="require"``: every endpoint answers /v1/models and serves the
   model (app/cli's default; ``--no-preflight`` skips 2 and 3);
3. the context: no prompt of the night can fit an endpoint's max-model-len even with all
   that may be left out left out (app/batch/contextfit.py).

``server="if_up"`` (the daemon) skips 2 and asks 3 only of a server that answers: one that is
down at fire time is the outage watch's, as during the night.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import Literal

from sqlalchemy import Engine

from agents.data import MarketBundle, get_provider
from agents.errors import DataError
from agents.smallest import smallest_prompts
from app.batch.contextfit import first_misfit, output_bounds
from app.config import Settings
from app.errors import ConfigError, InputError
from serving.preflight import check_endpoint
from serving.urls import redact

ServerCheck = Literal["require", "if_up", "skip"]

# Tickers named in a refusal at most; the rest are counted.
NAMED = 5


def check_start(settings: Settings, engine: Engine, as_of: date, tickers: list[str], *,
                server: ServerCheck) -> None:
    """Raise InputError or ConfigError (one line) when the batch could not run; else return.

    ``settings`` are the batch's own (a resumed batch's shape: app.batch.engine.shaped).
    No tickers (a resume that only writes the end its process died before writing): nothing
    to check.
    """
    if not tickers:
        return
    missing = provider_missing(settings, as_of, tickers)
    if missing:
        shown = ", ".join(missing[:NAMED]) + (f" and {len(missing) - NAMED} more"
                                             if len(missing) > NAMED else "")
        where = (f"the snapshot of {as_of} in {settings.data_dir}"
                 if settings.data_provider == "snapshot" else settings.data_provider)
        raise InputError(f"{len(missing)} of {len(tickers)} tickers not in {where}: {shown}")
    if server == "require":
        check_endpoints(settings)
    if server != "skip" and settings.check_context_length:
        check_context(settings, engine, as_of, tickers)


def provider_missing(settings: Settings, as_of: date, tickers: list[str]) -> list[str]:
    """Return the tickers the data provider lacks on ``as_of``; InputError without a snapshot."""
    try:
        return get_provider(settings.pipeline()).missing(tickers, as_of)
    except DataError as error:  # the snapshot provider: no snapshot for that date at all
        raise InputError(str(error)) from None


def check_endpoints(settings: Settings) -> None:
    """Raise ConfigError when an endpoint does not answer, or refuses the key or the model."""
    # Every listed endpoint: one with a wrong model or key would fail each ticker routed to it.
    for url in settings.base_urls:
        check = check_endpoint(url, settings.llm_model, settings.llm_api_key.get_secret_value())
        if check.level == "fail":
            where = f" ({redact(url)})" if len(settings.base_urls) > 1 else ""
            raise ConfigError(f"preflight{where}: {check.detail} "
                              "(--no-preflight skips this check)")


def check_context(settings: Settings, engine: Engine, as_of: date, tickers: list[str]) -> None:
    """Raise ConfigError naming the node when a prompt of the night cannot fit an endpoint."""
    pipeline = settings.pipeline()
    bundles = _bundles(settings, as_of, tickers)
    prompts = asyncio.run(smallest_prompts(pipeline, bundles))
    budgets = {p.node: p.max_tokens for p in prompts}
    bounds = output_bounds(engine, settings, budgets)
    for url in settings.base_urls:
        misfit = asyncio.run(first_misfit(settings, url, prompts, bounds))
        if misfit is not None:
            where = f" ({redact(url)})" if len(settings.base_urls) > 1 else ""
            raise ConfigError(f"preflight{where}: {misfit.describe()}; serve a longer "
                              "--max-model-len or lower NIGHTDESK_NODE_MAX_TOKENS "
                              "(--no-preflight skips this check)")


def _bundles(settings: Settings, as_of: date, tickers: list[str]) -> list[MarketBundle]:
    """Load the tickers' data the analysts' prompts are rendered from.

    A live provider's is fetched for the first ticker only (fetching every ticker twice a
    night is not worth it: the others' analysts are not checked). A ticker whose data does
    not load is left out: at night it fails alone, as bad data does.
    """
    provider = get_provider(settings.pipeline())
    chosen = tickers if settings.data_provider in ("snapshot", "demo") else tickers[:1]

    def load(ticker: str) -> MarketBundle | None:
        try:
            return provider.load(ticker, as_of)
        except DataError:
            return None

    with ThreadPoolExecutor(max_workers=settings.data_concurrency) as pool:
        return [b for b in pool.map(load, chosen) if b is not None]
