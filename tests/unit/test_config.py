from __future__ import annotations

from pathlib import Path

import pytest

from app.config import FLAT, get_settings, load_settings
from app.errors import ConfigError


def test_defaults_follow_the_qwen_non_thinking_sampling() -> None:
    s = load_settings()
    assert s.sampling.model_dump() == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                            "presence_penalty": 1.5, "enable_thinking": False}


def test_env_beats_toml_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "n.toml"
    cfg.write_text('llm_model = "from-file"\ntemperature = 0.1\n')
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(cfg))
    monkeypatch.setenv("NIGHTDESK_LLM_MODEL", "from-env")
    s = load_settings()
    assert s.llm.model == "from-env"
    assert s.sampling.temperature == 0.1


def test_settings_are_built_once() -> None:
    assert get_settings() is get_settings()


def test_postgres_url_gets_the_installed_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTDESK_DATABASE_URL", "postgresql://u@h/db")
    assert load_settings().store.database_url == "postgresql+psycopg://u@h/db"


@pytest.mark.parametrize(("key", "value", "named"), [
    ("NIGHTDESK_DATABASE_URL", "mysql://x/y", "NIGHTDESK_DATABASE_URL"),
    ("NIGHTDESK_CALL_TIMEOUT_S", "-5", "NIGHTDESK_CALL_TIMEOUT_S"),
    ("NIGHTDESK_MAX_CONCURRENCY", "zero", "NIGHTDESK_MAX_CONCURRENCY"),
    ("NIGHTDESK_SCHEDULE_CRON", "10 25 * * *", "NIGHTDESK_SCHEDULE_CRON"),
    ("NIGHTDESK_SCHEDULE_CRON", "every night", "NIGHTDESK_SCHEDULE_CRON"),
    ("NIGHTDESK_SCHEDULE_TIMEZONE", "Europe/Atlantis", "NIGHTDESK_SCHEDULE_TIMEZONE"),
    ("NIGHTDESK_SCHEDULE_MISFIRE_GRACE_S", "0", "NIGHTDESK_SCHEDULE_MISFIRE_GRACE_S"),
])
def test_bad_value_is_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, key: str, value: str, named: str
) -> None:
    monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert named in message and "\n" not in message
    assert info.value.exit_code == 2


def test_secret_is_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTDESK_LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("NIGHTDESK_TOP_P", "7")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "sk-very-secret" not in str(info.value)
    monkeypatch.delenv("NIGHTDESK_TOP_P")
    assert "sk-very-secret" not in repr(load_settings())
    assert "sk-very-secret" not in str(load_settings().snapshot())


def test_missing_config_file_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTDESK_CONFIG", "/nonexistent/n.toml")
    with pytest.raises(ConfigError, match="NIGHTDESK_CONFIG"):
        load_settings()


def test_unknown_node_group_is_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown node group"):
        load_settings(node_max_tokens={"nonsense": 3})


def test_one_endpoint_is_todays_single_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL", "http://gpu-host:8000/v1")
    s = load_settings()
    assert s.llm.base_url == s.llm.url == "http://gpu-host:8000/v1"
    assert s.llm.urls == ["http://gpu-host:8000/v1"]


def test_endpoints_from_a_comma_list_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL", " http://h:8000/v1/ ,https://h:8001/v1")
    s = load_settings()
    assert s.llm.urls == ["http://h:8000/v1", "https://h:8001/v1"]
    assert s.llm.url == "http://h:8000/v1"
    assert s.snapshot().base_url == "http://h:8000/v1,https://h:8001/v1"


def test_endpoints_from_a_toml_array(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "n.toml"
    cfg.write_text('llm_base_url = ["http://a:8000/v1", "http://b:8000/v1"]\n')
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(cfg))
    assert load_settings().llm.urls == ["http://a:8000/v1", "http://b:8000/v1"]


@pytest.mark.parametrize(("value", "says"), [
    ("http://a:8000/v1,ftp://b/v1", "endpoint 2 of 2 is not an http(s) URL"),
    ("http://a:8000/v1,,http://b/v1", "endpoint 2 of 3 is not an http(s) URL"),
    ("127.0.0.1:8000", "endpoint 1 of 1 is not an http(s) URL"),
    ("http://a:8000/v1,http://a:8000/v1/", "endpoint 2 of 2 is listed twice"),
    # One server under two spellings: two endpoints would count its cache twice.
    ("http://localhost:8000/v1,http://127.0.0.1:8000/v1", "endpoint 2 of 2 is listed twice"),
    ("http://a:8001/v1,HTTP://A:8000/v1,http://a:8000/v1", "endpoint 3 of 3 is listed twice"),
    ("http://a:80/v1,http://a/v1", "endpoint 2 of 2 is listed twice"),
    ("http://a:99999/v1", "endpoint 1 of 1 is not an http(s) URL"),
    (" , ", "no endpoint given"),
])
def test_a_bad_endpoint_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str,
                                    says: str) -> None:
    monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "NIGHTDESK_LLM_BASE_URL" in message and says in message and "\n" not in message


def test_servers_root_urls_listed_are_each_checked_not_the_joined_list(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # vllm-router's --worker-urls are roots; listed so, the joined text "…:8000,http://…"
    # was read as one URL with a bad port and refused as "not a URL". Each is a URL: the
    # preflight says a root has no /v1 (its 404).
    monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL", "http://a:8000,http://b:8000")
    assert load_settings().llm.urls == ["http://a:8000", "http://b:8000"]


def test_two_names_of_one_address_are_two_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not resolved, on purpose: an ingress on one address and port sends each name (its
    # Host) to a server of its own; merged, one of them would go unused
    # (docs/lab/2026-12-07-fleet-outside-2.md). A name and its address stay two as well.
    monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL",
                       "http://gpu-a.example:80/v1,http://gpu-b.example:80/v1,http://10.0.0.5/v1")
    assert len(load_settings().llm.urls) == 3


def test_a_bad_endpoint_never_echoes_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTDESK_LLM_BASE_URL", "http://a/v1,htp://user:hunter2@b/v1")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("empty", ["", "  "])
def test_every_setting_left_empty_reads_as_unset(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, empty: str) -> None:
    # docs/settings.md: an empty value is unset. A systemd EnvironmentFile often holds
    # `NIGHTDESK_X=`; a number or a word left so was refused, a text became "".
    monkeypatch.setenv("NIGHTDESK_HOME", str(tmp_path))
    unset = load_settings().model_dump()
    cfg = tmp_path / "n.toml"
    cfg.write_text('max_concurrency = 7\nschedule_cron = "5 1 * * *"\n')
    for name in sorted(FLAT):
        if name != "home":
            monkeypatch.setenv(f"NIGHTDESK_{name.upper()}", empty)
    assert load_settings().model_dump() == unset
    monkeypatch.setenv("NIGHTDESK_CONFIG", str(cfg))  # the file's value, not the empty one
    read = load_settings()
    assert (read.calls.max_concurrency, read.schedule.cron) == (7, "5 1 * * *")
