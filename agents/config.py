"""Hold the few settings the pipeline reads, as one frozen value the service builds for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

# Per-node output budgets: ~1.5k tokens, what a real model writes per call; the tiny CPU model
# gets far less (deploy/cpu-tiny.toml).
DEFAULT_NODE_MAX_TOKENS: Mapping[str, int] = MappingProxyType({
    "analyst": 1536,
    "researcher": 1536,
    "research_manager": 1536,
    "trader": 1024,
    "risk": 1536,
    "portfolio_manager": 768,
})


@dataclass(frozen=True)
class PipelineConfig:
    """Shape one ticker's run (rounds, budgets, retries) and name its market-data source.

    The service builds it from its settings (``app.config.Settings.pipeline``), where the
    values are validated and their defaults live; none are repeated here, so none can drift.
    """

    debate_rounds: int
    risk_rounds: int
    decision_attempts: int
    data_provider: str
    node_max_tokens: Mapping[str, int] = field(default_factory=lambda: DEFAULT_NODE_MAX_TOKENS)
    """Output budget per node group (analyst, researcher, research_manager, trader, risk,
    portfolio_manager)."""
    data_dir: Path | None = None
    """Where the snapshot provider reads; it needs one (None is a ConfigError there)."""
