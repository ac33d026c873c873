"""Write snapshots: the files a SnapshotProvider reads, from any provider's bundles.

Freezing a night's inputs makes them replayable: the same bundles, byte for byte, can be fed
to two server configurations for a fair comparison.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from agents.data.base import DataProvider, NewsItem, SocialPost
from agents.data.snapshot import (
    FUNDAMENTALS,
    MANIFEST,
    NEWS,
    PRICE_COLUMNS,
    PRICES,
    SOCIAL,
    UNIVERSE,
    Manifest,
    day_dir,
    ticker_dir,
)
from agents.errors import DataError, InputError, PipelineError


def write_ticker(
    data_dir: Path,
    as_of: date,
    ticker: str,
    prices: pd.DataFrame,
    fundamentals: dict[str, Any],
    news: list[NewsItem],
    social: list[SocialPost],
) -> Path:
    """Write one ticker's four files (prices may run past ``as_of``); return its directory."""
    folder = ticker_dir(data_dir, as_of, ticker)
    folder.mkdir(parents=True, exist_ok=True)
    table = prices[PRICE_COLUMNS].copy()
    table.index = pd.DatetimeIndex(table.index).strftime("%Y-%m-%d")
    table.index.name = "date"
    table["volume"] = table["volume"].round().astype("int64")
    # Default float formatting is repr: the shortest text that reads back to the same float.
    table.to_csv(folder / PRICES, lineterminator="\n")
    _write_json(folder / FUNDAMENTALS, _plain(fundamentals))
    _write_json(folder / NEWS, [
        {"published": n.published.isoformat(), "source": n.source, "headline": n.headline}
        for n in news
    ])
    _write_json(folder / SOCIAL, [
        {"posted": p.posted.isoformat(), "author": p.author, "text": p.text, "likes": p.likes}
        for p in social
    ])
    return folder


def write_manifest(data_dir: Path, as_of: date, manifest: Manifest) -> Path:
    """Write ``manifest.json`` and ``universe.txt`` for one as-of date; return the manifest path."""
    folder = day_dir(data_dir, as_of)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST
    _write_json(path, {
        "provider": manifest.provider,
        "created_at": manifest.created_at,
        "demo": manifest.demo,
        "tickers": manifest.tickers,
    })
    label = "DEMO (synthetic) " if manifest.demo else ""
    header = (
        f"# {label}universe of the {manifest.provider} snapshot for {as_of.isoformat()}\n"
        "# one ticker per line; '#' starts a comment\n"
    )
    (folder / UNIVERSE).write_text(header + "".join(f"{t}\n" for t in manifest.tickers),
                                   encoding="utf-8")
    return path


@dataclass
class FreezeResult:
    """What a freeze wrote and what it could not."""

    directory: Path
    """The as-of directory written to."""
    frozen: list[str] = field(default_factory=list)
    """Tickers written, in request order."""
    failed: dict[str, str] = field(default_factory=dict)
    """Ticker -> one-line reason, for tickers the provider could not load."""
    left: list[str] = field(default_factory=list)
    """Ticker folders of an earlier freeze of the date that this one's manifest does not
    list: kept, and not read (the snapshot holds what its manifest lists)."""


def freeze(
    provider: DataProvider,
    tickers: list[str],
    as_of: date,
    out_dir: Path,
    forward_days: int = 60,
    created_at: str | None = None,
) -> FreezeResult:
    """Write a snapshot of ``tickers`` from ``provider``; a failing ticker is recorded, not raised.

    Up to ``forward_days`` rows after ``as_of`` are kept too when the provider has them, so a
    frozen night can still be scored against realized returns. The manifest lists the tickers
    that were written and is only written when at least one was; it replaces an earlier
    freeze's of the date, whose other folders stay unread (``FreezeResult.left``).
    """
    source_dir = getattr(provider, "data_dir", None)
    if source_dir is not None and Path(source_dir).resolve() == Path(out_dir).resolve():
        raise InputError(f"freeze would overwrite its own source snapshot {out_dir}; "
                         "choose another --out")
    result = FreezeResult(directory=day_dir(out_dir, as_of))
    sources: set[str] = set()
    demo = False
    for ticker in tickers:
        try:
            bundle = provider.load(ticker, as_of)
            forward = provider.forward_prices(ticker, as_of, forward_days) if forward_days else None
        except PipelineError as error:
            result.failed[ticker] = str(error)
            continue
        except Exception as error:  # a provider's library may raise anything; keep going
            result.failed[ticker] = f"{ticker}: {type(error).__name__}: {error}"
            continue
        prices = bundle.prices
        if forward is not None and not forward.empty:
            prices = pd.concat([prices[PRICE_COLUMNS], forward[PRICE_COLUMNS]])
        write_ticker(out_dir, as_of, ticker, prices, bundle.fundamentals, bundle.news,
                     bundle.social)
        result.frozen.append(ticker)
        sources.add(bundle.source or provider.name)
        demo = demo or bundle.demo
    if result.frozen:
        write_manifest(out_dir, as_of, Manifest(
            provider="+".join(sorted(sources)),
            created_at=created_at or datetime.now(UTC).isoformat(timespec="seconds"),
            demo=demo,
            tickers=result.frozen,
        ))
        result.left = sorted(p.name for p in result.directory.iterdir()
                             if p.is_dir() and p.name not in result.frozen)
    return result


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n",
                    encoding="utf-8")


def _plain(value: Any) -> Any:
    """Turn numpy scalars into Python ones and NaN into null, so the JSON is standard."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise DataError(f"cannot write {type(value).__name__} value {value!r} to a snapshot")
