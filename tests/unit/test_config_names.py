"""Every setting keeps its flat name: ``NIGHTDESK_<NAME>`` and the TOML key ``<name>`` land in
the same setting as before the settings were grouped (the table was read off the flat class)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from app.config import FLAT, TEST_ENV_PREFIX, Settings, known_env_names, load_settings
from app.errors import ConfigError

# flat name -> (where it lands now, a non-default value as env text, the value it becomes)
NAMES: dict[str, tuple[str, str, Any]] = {
    "home": ("paths.home", "/tmp/nd-home", Path("/tmp/nd-home")),
    "database_url": ("store.database_url", "sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    "llm_base_url": ("llm.base_url", "http://a:1/v1", "http://a:1/v1"),
    "llm_router_servers": ("llm.router_servers", "http://r:2", "http://r:2"),
    "llm_server_header": ("llm.server_header", "X-Served-By", "X-Served-By"),
    "llm_model": ("llm.model", "m-1", "m-1"),
    "llm_api_key": ("llm.api_key", "k-1", SecretStr("k-1")),
    "data_dir": ("paths.data_dir", "/tmp/d", Path("/tmp/d")),
    "models_dir": ("paths.models_dir", "/tmp/m", Path("/tmp/m")),
    "server_dir": ("paths.server_dir", "/tmp/s", Path("/tmp/s")),
    "vllm_venv": ("paths.vllm_venv", "/tmp/v", Path("/tmp/v")),
    "data_provider": ("agents.data_provider", "demo", "demo"),
    "temperature": ("sampling.temperature", "0.3", 0.3),
    "top_p": ("sampling.top_p", "0.5", 0.5),
    "top_k": ("sampling.top_k", "7", 7),
    "presence_penalty": ("sampling.presence_penalty", "0.25", 0.25),
    "enable_thinking": ("sampling.enable_thinking", "true", True),
    "call_timeout_s": ("calls.call_timeout_s", "11", 11.0),
    "max_attempts": ("calls.max_attempts", "4", 4),
    "retry_backoff_s": ("calls.retry_backoff_s", "0.5", 0.5),
    "retry_wait_max_s": ("calls.retry_wait_max_s", "9", 9.0),
    "max_concurrency": ("calls.max_concurrency", "13", 13),
    "check_context_length": ("calls.check_context_length", "false", False),
    "context_check_includes_output": ("calls.context_check_includes_output", "false", False),
    "priority_scheduling": ("calls.priority_scheduling", "true", True),
    "request_seeds": ("calls.request_seeds", "false", False),
    "debate_rounds": ("agents.debate_rounds", "3", 3),
    "risk_rounds": ("agents.risk_rounds", "4", 4),
    "decision_attempts": ("agents.decision_attempts", "5", 5),
    "node_max_tokens": ("agents.node_max_tokens.trader", '{"trader": 77}', 77),
    "samples": ("batch.samples", "6", 6),
    "data_concurrency": ("batch.data_concurrency", "9", 9),
    "monitor_trailing_batches": ("quality.trailing_batches", "7", 7),
    "monitor_max_grade_share": ("quality.max_grade_share", "0.6", 0.6),
    "monitor_false_alarm_rate": ("quality.false_alarm_rate", "0.02", 0.02),
    "monitor_min_tickers": ("quality.min_tickers", "8", 8),
    "monitor_new_normal_after": ("quality.new_normal_after", "4", 4),
    "quality_benchmark": ("quality.benchmark", "SPY", "SPY"),
    "server_profile": ("llm.server_profile", "gpu-x", "gpu-x"),
    "metrics_interval_s": ("llm.metrics_interval_s", "3", 3.0),
    "heartbeat_interval_s": ("batch.heartbeat_interval_s", "31", 31.0),
    "heartbeat_stale_s": ("batch.heartbeat_stale_s", "121", 121.0),
    "outage_budget_s": ("batch.outage_budget_s", "901", 901.0),
    "db_write_budget_s": ("store.db_write_budget_s", "122", 122.0),
    "db_statement_timeout_s": ("store.db_statement_timeout_s", "2.5", 2.5),
    "server_probe_interval_s": ("llm.server_probe_interval_s", "2", 2.0),
    "shutdown_grace_s": ("batch.shutdown_grace_s", "61", 61.0),
    "checkpoint_durability": ("store.checkpoint_durability", "async", "async"),
    "record_requests": ("store.record_requests", "false", False),
    "log_format": ("log.format", "json", "json"),
    "log_level": ("log.level", "debug", "DEBUG"),
    "web_user": ("web.user", "ops", "ops"),
    "web_password": ("web.password", "pw", SecretStr("pw")),
    "web_base_url": ("web.base_url", "https://nd.example.org/", "https://nd.example.org"),
    "notify": ("notify.urls", "json://127.0.0.1:9/a", "json://127.0.0.1:9/a"),
    "notify_timeout_s": ("notify.timeout_s", "31", 31.0),
    "universe_file": ("paths.universe_file", "/tmp/u.txt", Path("/tmp/u.txt")),
    "schedule_cron": ("schedule.cron", "5 1 * * *", "5 1 * * *"),
    "schedule_timezone": ("schedule.timezone", "Europe/Berlin", "Europe/Berlin"),
    "schedule_misfire_grace_s": ("schedule.misfire_grace_s", "60", 60),
    "schedule_start_grace_s": ("schedule.start_grace_s", "61", 61.0),
    "schedule_repeat_as_of": ("schedule.repeat_as_of", "true", True),
}


def landed(settings: Settings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def test_the_names_are_exactly_the_flat_settings_names() -> None:
    assert set(FLAT) == set(NAMES), set(FLAT) ^ set(NAMES)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_an_environment_variable_lands_where_it_did(monkeypatch: pytest.MonkeyPatch,
                                                    name: str) -> None:
    path, text, value = NAMES[name]
    assert landed(load_settings(), path) != value  # the test value is not the default
    monkeypatch.setenv(f"NIGHTDESK_{name.upper()}", text)
    assert landed(load_settings(), path) == value


def test_every_toml_key_lands_where_it_did(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    lines = []
    for name, (_, text, value) in NAMES.items():
        if name == "node_max_tokens":
            lines.append(f"node_max_tokens = {{ trader = {json.loads(text)['trader']} }}")
        elif isinstance(value, bool | int | float) and not isinstance(value, Path):
            lines.append(f"{name} = {text}")
        else:
            lines.append(f"{name} = {json.dumps(text)}")
    config = tmp_path / "all.toml"
    config.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(config))
    monkeypatch.delenv("NIGHTDESK_HOME")  # tests/conftest.py's; here the file names the home
    settings = load_settings()
    assert {name: landed(settings, path) for name, (path, _, _) in NAMES.items()} == {
        name: value for name, (_, _, value) in NAMES.items()}


@pytest.mark.parametrize("name", ["monitor_min_tickers", "web_base_url", "llm_base_url",
                                  "schedule_cron", "log_level", "notify_timeout_s"])
def test_a_bad_grouped_value_names_its_variable_on_one_line(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(f"NIGHTDESK_{name.upper()}", "-")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert f"invalid setting NIGHTDESK_{name.upper()}:" in str(info.value)
    assert "\n" not in str(info.value)


def test_flat_overrides_replace_one_setting() -> None:
    settings = load_settings(monitor_min_tickers=9).updated(llm_base_url="http://b:2/v1")
    assert (settings.quality.min_tickers, settings.llm.url) == (9, "http://b:2/v1")


@pytest.mark.parametrize(("name", "says"), [
    ("NIGHTDESK_SAMPLE", "did you mean NIGHTDESK_SAMPLES?"),
    ("nightdesk_llm_modle", "did you mean NIGHTDESK_LLM_MODEL?"),
    ("NIGHTDESK_BOGUS", "no such setting")])
def test_an_unknown_name_is_refused_naming_the_closest_known_one(
        monkeypatch: pytest.MonkeyPatch, name: str, says: str) -> None:
    monkeypatch.setenv(name, "4")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value).startswith(f"invalid setting {name}: no such setting")
    assert says in str(info.value) and "\n" not in str(info.value)


ROOT = Path(__file__).resolve().parents[2]
# Where the project itself names a NIGHTDESK_ variable for nightdesk to read: the settings'
# page, the deploy units and env files, the Makefile, the code, the bench scripts and the
# tests' harness (not the tests that set a wrong name on purpose, nor the lab notes' history).
READERS = ["docs/settings.md", "docs/operations.md", "deploy", "Makefile", "app", "agents",
           "serving", "docs/bench", "tests/conftest.py", "tests/unit/conftest.py",
           "tests/integration", "tests/bench"]


def test_every_name_the_project_documents_sets_or_reads_is_known(
        monkeypatch: pytest.MonkeyPatch) -> None:
    names: set[str] = set()
    for reader in READERS:
        path = ROOT / reader
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.is_file() and file.suffix not in (".pyc", ".png", ".json", ".gz"):
                names |= set(re.findall(r"\bNIGHTDESK_[A-Z0-9_]*[A-Z0-9]\b",
                                        file.read_text(errors="replace")))
    names.discard("NIGHTDESK_SAMPLE")  # docs/settings.md's example of a typo
    assert "NIGHTDESK_VLLM_MODEL" in names and "NIGHTDESK_HOME" in names
    assert {name for name in names if not name.startswith(TEST_ENV_PREFIX)} - known_env_names() \
        == set()
    # The names that set nothing (the vLLM unit's, the tests' own) pass load_settings too.
    for name in names - {f"NIGHTDESK_{flat.upper()}" for flat in FLAT} - {"NIGHTDESK_CONFIG"}:
        monkeypatch.setenv(name, "x")
    load_settings()
