"""Market data behind one interface: pick a provider by name with ``get_provider``."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from agents.config import PipelineConfig
from agents.data.base import DataProvider, MarketBundle, NewsItem, SocialPost
from agents.errors import ConfigError, DataError

PROVIDERS = ("snapshot", "demo", "yfinance")

__all__ = [
    "PROVIDERS",
    "DataProvider",
    "MarketBundle",
    "NewsItem",
    "SocialPost",
    "get_provider",
    "serves_demo",
]


def get_provider(config_or_name: PipelineConfig | str, data_dir: Path | str | None = None,
                 ) -> DataProvider:
    """Build the provider named by ``config.data_provider`` or by a plain name.

    ``data_dir`` (default: ``config.data_dir``) matters only to the snapshot provider, which
    needs one: the folder is the caller's setting, never a guess. yfinance is imported only
    when asked for.
    """
    if isinstance(config_or_name, PipelineConfig):
        name: str = config_or_name.data_provider
        data_dir = data_dir if data_dir is not None else config_or_name.data_dir
    else:
        name = config_or_name
    if name == "snapshot":
        from agents.data.snapshot import SnapshotProvider

        if data_dir is None:
            raise ConfigError("the snapshot provider needs a data folder (setting data_dir)")
        return SnapshotProvider(Path(data_dir))
    if name == "demo":
        from agents.data.demo import DemoProvider

        return DemoProvider()
    if name == "yfinance":
        from agents.data.yfinance_provider import YFinanceProvider

        return YFinanceProvider()
    raise ConfigError(f"unknown data provider {name!r} (choose from {', '.join(PROVIDERS)})")


def serves_demo(provider: DataProvider, as_of: date) -> bool:
    """Return whether ``provider`` serves demo data for ``as_of``, before any is loaded.

    The demo provider always does; a snapshot does when its manifest says so (one that
    cannot be read is taken for no demo: nothing says it is); yfinance never does.
    """
    if provider.name == "demo":
        return True
    manifest = getattr(provider, "manifest", None)
    if manifest is None:
        return False
    try:
        return bool(manifest(as_of).demo)
    except DataError:
        return False
