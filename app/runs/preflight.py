"""Refuse a batch that cannot work before any of its rows exist: the check every start runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Literal

import httpx
import structlog
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from agents.data import MarketBundle, get_provider, serves_demo
from agents.data.snapshot import latest_as_of
from agents.errors import DataError
from agents.smallest import SmallestPrompt, smallest_prompts
from app.config import Settings
from app.db.engine import get_engine
from app.db.models import Batch, LLMCall, NightRefusal
from app.errors import ConfigError, InputError, LLMError, first_line
from app.morning.digest import refusal_title, send_refusal
from app.notify import Level
from app.promptsize import PromptCounter, message_bytes
from serving.preflight import check_endpoint, check_load_readable
from serving.urls import redact, server_root

log = structlog.get_logger(__name__)

ServerCheck = Literal["require", "if_up", "skip"]

# Tickers named in a refusal at most; the rest are counted.
NAMED = 5
# /tokenize answers in milliseconds; a server slower than this is left to the night.
TOKENIZE_TIMEOUT_S = 10.0


class PreflightRefused(ConfigError):
    """The server cannot run the night as set. The command that asked says how to skip the
    check, where it has a way (the daemon has none)."""


def check_start(settings: Settings, engine: Engine, as_of: date, tickers: list[str], *,
                server: ServerCheck, budgets_kept: str | None = None) -> None:
    """Raise InputError or ConfigError (one line, exit 2) when the batch could not run:
    the data lacks a ticker on the date; with ``server="require"``, an endpoint does not
    serve the model; unless ``"skip"``, a prompt of the night at its smallest
    (agents/smallest.py) overruns an endpoint's max-model-len (``"if_up"``: ask only a
    server that answers). ``settings`` are the batch's own (a resumed batch's shape);
    ``budgets_kept``: why its output budgets are not the settings' to lower, and the way
    out (a resumed batch), said instead of advising NIGHTDESK_NODE_MAX_TOKENS.
    """
    if not tickers:
        return
    missing = provider_missing(settings, as_of, tickers)
    if missing:
        shown = ", ".join(missing[:NAMED]) + (f" and {len(missing) - NAMED} more"
                                             if len(missing) > NAMED else "")
        where = (f"the snapshot of {as_of} in {settings.paths.data_dir}"
                 if settings.agents.data_provider == "snapshot" else settings.agents.data_provider)
        raise InputError(f"{len(missing)} of {len(tickers)} tickers not in {where}: {shown}")
    if server == "require":
        check_endpoints(settings)
    if server != "skip" and settings.calls.check_context_length:
        check_context(settings, engine, as_of, tickers, budgets_kept)


def provider_missing(settings: Settings, as_of: date, tickers: list[str]) -> list[str]:
    """Return the tickers the data provider lacks on ``as_of``; InputError without a snapshot."""
    try:
        return get_provider(settings.pipeline()).missing(tickers, as_of)
    except DataError as error:  # the snapshot provider: no snapshot for that date at all
        raise InputError(str(error)) from None


def check_endpoints(settings: Settings) -> None:
    """Raise ConfigError when an endpoint does not answer, refuses the key or the model, or
    hides the load the night reads (``check_load_readable``); one that answers busy (HTTP
    429/503) passes with a warning: its load is the night's to wait out, not a verdict on
    the settings."""
    # Every listed endpoint: one with a wrong model or key would fail each ticker routed to it.
    for url in settings.llm.urls:
        check = check_endpoint(url, settings.llm.model, settings.llm.api_key.get_secret_value())
        if check.level == "ok":  # and the night can read its load (a gateway may hide it)
            check = check_load_readable(url, settings.llm.router_urls)
        if check.level == "warn":
            log.warning("preflight: server not checked", detail=check.detail)
        if check.level == "fail":
            where = f" ({redact(url)})" if len(settings.llm.urls) > 1 else ""
            raise PreflightRefused(f"preflight{where}: {check.detail}")


def check_context(settings: Settings, engine: Engine, as_of: date, tickers: list[str],
                  budgets_kept: str | None = None) -> None:
    """Raise ConfigError naming the node when a prompt of the night cannot fit an endpoint,
    and what fixes it (``budgets_kept``: as ``check_start``)."""
    lower = (f" ({budgets_kept})" if budgets_kept
             else " or lower NIGHTDESK_NODE_MAX_TOKENS")
    bundles = _bundles(settings, as_of, tickers)
    prompts = asyncio.run(smallest_prompts(settings.pipeline(), bundles))
    bounds = output_bounds(engine, settings, {p.node: p.max_tokens for p in prompts})
    for url in settings.llm.urls:
        misfit = asyncio.run(first_misfit(settings, url, prompts, bounds))
        if misfit is not None:
            where = f" ({redact(url)})" if len(settings.llm.urls) > 1 else ""
            raise PreflightRefused(f"preflight{where}: {misfit.describe()}; serve a longer "
                                   f"--max-model-len{lower}")


def _bundles(settings: Settings, as_of: date, tickers: list[str]) -> list[MarketBundle]:
    """Load the tickers' data the analysts' prompts are rendered from: a live provider's
    for the first ticker only (a second fetch of every ticker a night is not worth it); a
    ticker whose data does not load is left out (at night it fails alone)."""
    provider = get_provider(settings.pipeline())
    chosen = tickers if settings.agents.data_provider in ("snapshot", "demo") else tickers[:1]

    def load(ticker: str) -> MarketBundle | None:
        try:
            return provider.load(ticker, as_of)
        except DataError:
            return None

    with ThreadPoolExecutor(max_workers=settings.batch.data_concurrency) as pool:
        return [b for b in pool.map(load, chosen) if b is not None]


@dataclass(frozen=True)
class Misfit:
    """A prompt that cannot fit: its node, its ticker, the estimate and the server's limit."""

    node: str
    ticker: str
    tokens: int
    budget: int
    max_model_len: int
    carried: int  # of ``tokens``: the earlier outputs the prompt holds
    shortest: str | None = None  # behind a router: the server whose limit it is

    def describe(self) -> str:
        held = f", {self.carried} of them earlier nodes' outputs" if self.carried else ""
        plus = f" + max_tokens {self.budget}" if self.budget else ""
        whose = (f"max_model_len {self.max_model_len} of {self.shortest}, the shortest server "
                 "behind the router" if self.shortest
                 else f"the server's max_model_len {self.max_model_len}")
        return (f"{self.node}'s prompt at its smallest ({self.ticker}) is about {self.tokens} "
                f"tokens{held}{plus}: over {whose}")


def output_bounds(engine: Engine, settings: Settings, budgets: dict[str, int]) -> dict[str, int]:
    """Return the tokens each node's output may take in a later prompt: its longest in the
    previous nightly batch of this model, at most its max_tokens in ``budgets``."""
    with engine.connect() as conn:
        latest = conn.execute(
            select(func.max(LLMCall.batch_id)).join(Batch, Batch.id == LLMCall.batch_id)
            .where(Batch.kind == "nightly", LLMCall.status == "ok",
                   LLMCall.model == settings.llm.model)).scalar()
        seen: dict[str, int] = {}
        if latest is not None:
            seen = {node: int(tokens) for node, tokens in conn.execute(
                select(LLMCall.node, func.max(LLMCall.completion_tokens))
                .where(LLMCall.batch_id == latest, LLMCall.status == "ok",
                       LLMCall.completion_tokens.is_not(None))
                .group_by(LLMCall.node))}
    return {node: min(budget, seen.get(node, budget)) for node, budget in budgets.items()}


def http_client() -> httpx.AsyncClient:
    """Return the client that asks /tokenize (a unit test puts its fake server here)."""
    return httpx.AsyncClient(timeout=httpx.Timeout(TOKENIZE_TIMEOUT_S))


async def first_misfit(settings: Settings, base_url: str, prompts: Iterable[SmallestPrompt],
                       bounds: dict[str, int]) -> Misfit | None:
    """Return a prompt that cannot fit the server at ``base_url`` (counted plus earlier
    outputs plus output budget), largest first; None when none, or the server cannot tell."""
    def upper(prompt: SmallestPrompt) -> int:
        return message_bytes(prompt.messages) + sum(bounds[n] for n in prompt.carries)

    async with http_client() as http:
        counter = PromptCounter(settings, http, server_root(base_url) + "/tokenize")
        for prompt in sorted(prompts, key=upper, reverse=True):
            carried = sum(bounds[n] for n in prompt.carries)
            budget = counter.budget(prompt.max_tokens)
            if counter.fits_without_counting(prompt.messages, budget + carried):
                continue
            try:
                count = await counter.count(settings.llm.model, prompt.messages)
            except LLMError as error:
                log.info("context not checked before the night", endpoint=redact(base_url),
                         reason=str(error))
                return None
            if count is None or counter.max_model_len is None:
                return None
            if count + carried + budget > counter.max_model_len:
                shortest = counter.shortest
                return Misfit(prompt.node, prompt.ticker, count + carried, budget,
                              counter.max_model_len, carried,
                              shortest[0] if shortest and shortest[1] == counter.max_model_len
                              else None)
    return None


def refusal_demo(settings: Settings, as_of: date | None) -> bool:
    """Return whether a refused night would have run on DEMO data, as the engine labels a
    batch (``serves_demo``: its provider, for its date; a date not known yet, the newest
    snapshot's); False where that cannot be told (nothing says it is)."""
    try:
        day = as_of or latest_as_of(settings.paths.data_dir) or datetime.now(UTC).date()
        return serves_demo(get_provider(settings.pipeline()), day)
    except Exception:  # the provider itself refused (yfinance not installed): not told
        return False


def tell_refusal(settings: Settings, as_of: date | None, why: str, advice: str, *,
                 command: str | None = None, outcome: str = "no batch run",
                 headline: str | None = None, store: bool = True,
                 demo: bool | None = None, level: Level = "failure",
                 once: bool = False) -> bool:
    """Tell of a night refused at its start: store it (``NightRefusal``; the morning's
    status names it until a later night starts) and push its digest (``send_refusal``).

    ``command``: the command ``advice`` names to start the night again, where it names one.
    ``store=False``: the digest alone (a schema this install does not know takes no row).
    ``demo``: whether the night would have run on DEMO data (None: ``refusal_demo``); its
    digest's title and the stored one begin with the label, as a demo batch's do.
    ``level``: the digest's (a notice that nothing was refused is no failure). ``once``: a
    notice told once per as-of date and title: where its row is stored already, that row's
    time moves to now (the morning reads the newest fire) and nothing is pushed.
    Return whether the digest was pushed (or would be: no destination set).
    Never raises: the database may be what refused the night, whose one line has said so
    (the row not stored is then only a debug line: one line per error), and the digest
    says that the pages cannot show it: it alone tells the operator.
    """
    stored = store
    demo = refusal_demo(settings, as_of) if demo is None else demo
    title = refusal_title(as_of, outcome, headline, demo)
    try:
        if store:
            with Session(get_engine(settings.store.database_url,
                                    settings.store.db_statement_timeout_s)) as session:
                told = session.scalars(select(NightRefusal).where(
                    NightRefusal.as_of == as_of, NightRefusal.title == title)
                    .order_by(NightRefusal.id.desc()).limit(1)).first() if once else None
                if told is not None:
                    told.refused_at = datetime.now(UTC)
                else:
                    session.add(NightRefusal(refused_at=datetime.now(UTC), as_of=as_of,
                                             title=title, why=why, advice=advice,
                                             command=command))
                session.commit()
                if told is not None:
                    log.info("notice already told", as_of=str(as_of), title=title)
                    return False
    except Exception as error:
        log.debug("refusal not stored", error=first_line(error))
        stored = False
    send_refusal(settings, as_of, why, advice, outcome, headline, stored=stored, demo=demo,
                 level=level)
    return True
