"""Check the systemd units in deploy/: systemd's own verifier, their wiring, and their commands.

``systemd-analyze verify`` insists that every ExecStart binary exists, and the units name the
installed path (/opt/nightdesk/venv/bin/nightdesk). So a copy is verified with that path
pointing at this checkout's real ``nightdesk``; nothing else is changed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from app.cli import app as cli
from app.config import FLAT, flat_field, load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = sorted([*DEPLOY.glob("*.service"), *DEPLOY.glob("*.timer")])
INSTALLED = "/opt/nightdesk/venv/bin/nightdesk"
VENV_BIN = "/opt/nightdesk/venv/bin/"  # nightdesk's and its extras' executables
NIGHTDESK = Path(sys.executable).with_name("nightdesk")
ENV_FILE = "/etc/nightdesk/nightdesk.env"


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Read a unit file into section -> key -> every value given (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}: continuation lines are not read here"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path.name}: cannot read {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def words(values: list[str]) -> list[str]:
    return [word for value in values for word in value.split()]


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is missing: `make test` installs Debian's systemd package "
                    "(apt-get install -y systemd)")
    return found


def verify(paths: list[Path], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``systemd-analyze verify`` on copies of ``paths`` whose nightdesk is this one."""
    tmp.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in paths:
        copy = tmp / path.name
        copy.write_text(path.read_text().replace(VENV_BIN, f"{NIGHTDESK.parent}/"))
        copies.append(copy)
    # The alert template is verified as the instance OnFailure= starts.
    for copy in list(copies):
        if copy.name.endswith("@.service"):
            instance = tmp / copy.name.replace("@.service", "@nightdesk-batch.service.service")
            instance.symlink_to(copy.name)
            copies.append(instance)
    return subprocess.run([systemd_analyze(), "verify", "--man=no", *map(str, copies)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp}:"})


def test_the_expected_units_are_there() -> None:
    assert {u.name for u in UNITS} == {
        "nightdesk-vllm.service", "nightdesk-batch.service", "nightdesk-batch.timer",
        "nightdesk-scheduler.service", "nightdesk-web.service", "nightdesk-alert@.service",
        "nightdesk-router.service"}


def test_systemd_analyze_verify_passes_on_every_unit(tmp_path: Path) -> None:
    result = verify(UNITS, tmp_path)
    # verify exits 0 on a misspelt key or value ("..., ignoring"): any output is a failure.
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr


def test_the_verify_check_catches_a_misspelt_unit(tmp_path: Path) -> None:
    broken = tmp_path / "src" / "nightdesk-broken.service"
    broken.parent.mkdir()
    text = (DEPLOY / "nightdesk-batch.service").read_text()
    broken.write_text(text.replace("Type=oneshot", "Type=oneshott")
                      .replace("TimeoutStartSec=", "TimeoutStartSecs="))
    result = verify([broken], tmp_path / "verify")
    assert "oneshott" in result.stderr and "TimeoutStartSecs" in result.stderr
    missing = tmp_path / "src" / "nightdesk-missing.service"
    missing.write_text(text.replace(INSTALLED, "/opt/nowhere/bin/nightdesk"))
    assert verify([missing], tmp_path / "verify2").returncode != 0


def test_the_batch_unit_wants_vllm_and_never_requires_it() -> None:
    unit = parse_unit(DEPLOY / "nightdesk-batch.service")
    vllm = "nightdesk-vllm.service"
    assert vllm in words(unit["Unit"]["Wants"])
    assert vllm in words(unit["Unit"]["After"])
    # A dependency that would stop or refuse the batch when vLLM restarts, in any section.
    binding = ("Requires", "BindsTo", "Requisite", "PartOf", "Upholds", "StopPropagatedFrom")
    for section in unit.values():
        for key in binding:
            assert vllm not in words(section.get(key, [])), key
    service = unit["Service"]
    assert service["Type"] == ["oneshot"]
    assert service["TimeoutStartSec"] and service["TimeoutStartSec"][0] != "infinity"
    assert unit["Unit"]["OnFailure"] == ["nightdesk-alert@%n.service"]
    assert (DEPLOY / "nightdesk-alert@.service").is_file()
    # Started again the same night, it continues tonight's batch rather than a second one.
    assert shlex.split(service["ExecStart"][0])[1:] == ["run", "--continue-night"]


@pytest.mark.parametrize("name", ["nightdesk-batch.service", "nightdesk-scheduler.service"])
def test_both_ways_of_firing_the_night_start_the_alert_when_they_fail(name: str) -> None:
    # The timer's batch unit fails on a partial or failed night; the daemon's unit when it
    # cannot keep running. Either way the alert unit is started, as its instance verified.
    unit = parse_unit(DEPLOY / name)
    assert unit["Unit"]["OnFailure"] == ["nightdesk-alert@%n.service"]


def test_the_timer_fires_the_batch_at_0010_and_catches_up() -> None:
    timer = parse_unit(DEPLOY / "nightdesk-batch.timer")["Timer"]
    assert timer["Persistent"] == ["true"]
    assert timer["AccuracySec"] == ["1s"]
    assert timer["Unit"] == ["nightdesk-batch.service"]
    normalized = subprocess.run([systemd_analyze(), "calendar", timer["OnCalendar"][0]],
                                capture_output=True, text=True, check=True).stdout
    assert re.search(r"Normalized form: \*-\*-\* 00:10:00$", normalized, re.MULTILINE)


def test_the_vllm_unit_waits_for_health_and_restarts_on_failure() -> None:
    service = parse_unit(DEPLOY / "nightdesk-vllm.service")["Service"]
    assert service["Type"] == ["exec"]
    assert service["Restart"] == ["on-failure"]
    assert "server start --foreground" in service["ExecStart"][0]
    assert "server wait" in service["ExecStartPost"][0]
    timeout = subprocess.run([systemd_analyze(), "timespan", service["TimeoutStartSec"][0]],
                             capture_output=True, text=True, check=True).stdout
    micros = int(re.search(r"μs: (\d+)", timeout).group(1))  # type: ignore[union-attr]
    assert micros >= 20 * 60 * 1_000_000  # model loading takes minutes
    # The health wait gives up before systemd does, so its own message is what is logged.
    wait = shlex.split(service["ExecStartPost"][0])
    assert float(wait[wait.index("--timeout") + 1]) * 1_000_000 < micros


def test_every_service_runs_as_nightdesk_with_the_environment_file() -> None:
    for path in UNITS:
        if path.suffix != ".service" or path.name.startswith("nightdesk-alert@"):
            continue
        service = parse_unit(path)["Service"]
        assert service["User"] == ["nightdesk"], path.name
        assert service["EnvironmentFile"] == [ENV_FILE], path.name
        assert all(cmd.startswith(VENV_BIN) for key in ("ExecStart", "ExecStartPost")
                   for cmd in service.get(key, [])), path.name


def test_every_nightdesk_command_in_the_units_exists() -> None:
    # The units call the CLI: a renamed command or option would only show at 00:10.
    for path in UNITS:
        for section in parse_unit(path).values():
            for key in ("ExecStart", "ExecStartPost"):
                for command in section.get(key, []):
                    argv = shlex.split(command.replace("${NIGHTDESK_VLLM_MODEL}", "/m"))
                    if argv[0] != INSTALLED:
                        continue
                    result = CliRunner().invoke(cli, [*argv[1:], "--help"])
                    assert result.exit_code == 0, (path.name, argv, result.output)


def test_the_example_environment_file_holds_real_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [line for line in (DEPLOY / "nightdesk.env.example").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    values = dict(line.split("=", 1) for line in lines)
    names = {k.removeprefix("NIGHTDESK_").lower() for k in values if k.startswith("NIGHTDESK_")}
    # NIGHTDESK_VLLM_MODEL is read by the vLLM unit's command line, not by the settings.
    assert names - {"vllm_model"} <= set(FLAT), names - set(FLAT)
    for key, value in values.items():
        if key.startswith("NIGHTDESK_"):
            monkeypatch.setenv(key, value)
    settings = load_settings()  # read from the environment as the units do; all valid
    assert settings.schedule.timezone == "Europe/Berlin"
    assert settings.store.database_url.startswith("postgresql+psycopg://")


def test_a_stopped_batch_gets_its_grace_before_systemd_kills_it() -> None:
    # SIGTERM lets calls at the server finish for NIGHTDESK_SHUTDOWN_GRACE_S, then the batch
    # writes its status: systemd must not SIGKILL it sooner, or the night ends `running`.
    grace = flat_field("shutdown_grace_s").default
    example = dict(line.split("=", 1) for line in
                   (DEPLOY / "nightdesk.env.example").read_text().splitlines()
                   if line.strip() and not line.lstrip().startswith("#"))
    grace = max(grace, float(example.get("NIGHTDESK_SHUTDOWN_GRACE_S", grace)))
    # Then the interrupted night's digest goes out, within its own limit.
    notify = flat_field("notify_timeout_s").default
    notify = max(notify, float(example.get("NIGHTDESK_NOTIFY_TIMEOUT_S", notify)))
    for name in ("nightdesk-batch.service", "nightdesk-scheduler.service"):
        [stop] = parse_unit(DEPLOY / name)["Service"]["TimeoutStopSec"]
        match = re.fullmatch(r"(\d+)(min|s)?", stop)
        assert match, (name, stop)
        seconds = int(match.group(1)) * (60 if match.group(2) == "min" else 1)
        # Room to write the status, then send the digest.
        assert seconds >= grace + notify + 30, (name, stop, grace, notify)


OPERATIONS = DEPLOY.parent / "docs" / "operations.md"
# The most exposure `systemd-analyze security` may rate a unit (issue 42): the vLLM unit
# needs the GPU, JIT-compiled kernels and CPU pinning, the others none of that.
EXPOSURE_LIMITS = {"nightdesk-vllm.service": 6.9}
EXPOSURE_LIMIT = 4.9
_OVERALL = re.compile(r"Overall exposure level for \S+: (\d+\.\d) (\w+)")


def exposure(path: Path) -> tuple[float, str]:
    """Return ``systemd-analyze security --offline=true``'s overall figure and word for a unit."""
    result = subprocess.run([systemd_analyze(), "security", "--offline=true", "--no-pager",
                             str(path)], capture_output=True, text=True, timeout=120)
    found = _OVERALL.search(result.stdout + result.stderr)
    assert found, (path.name, result.returncode, result.stdout[-500:], result.stderr[-500:])
    return float(found.group(1)), found.group(2)


def documented_exposure() -> dict[str, tuple[float, str, float]]:
    """Read docs/operations.md's table: unit -> (figure, word, limit)."""
    rows = re.findall(r"^\| `(nightdesk-[^`]+)` \| (\d+\.\d) (\w+) \| (\d+\.\d) \|$",
                      OPERATIONS.read_text(), re.MULTILINE)
    return {name: (float(figure), word, float(limit)) for name, figure, word, limit in rows}


def test_every_service_is_hardened_within_its_exposure_limit() -> None:
    services = [u for u in UNITS if u.suffix == ".service"]
    for path in services:
        figure, _ = exposure(path)
        limit = EXPOSURE_LIMITS.get(path.name, EXPOSURE_LIMIT)
        assert figure <= limit, (path.name, figure, limit)


def test_the_operations_table_gives_what_systemd_analyze_reports() -> None:
    table = documented_exposure()
    services = {u.name for u in UNITS if u.suffix == ".service"}
    assert set(table) == services, set(table) ^ services
    # Every other unit (the timer) is named too, as not rated: systemd-analyze gives a timer
    # the figure of a service with no setting (9.8 UNSAFE), which an operator running it on
    # every unit in deploy/ would otherwise meet unexplained.
    unrated = set(re.findall(r"^\| `(nightdesk-[^`]+)` \| not rated \| — \|$",
                             OPERATIONS.read_text(), re.MULTILINE))
    others = {u.name for u in UNITS} - services
    assert unrated == others, unrated ^ others
    for name in others:
        assert "Service" not in parse_unit(DEPLOY / name), name  # it runs no process itself
    for name, (figure, word, limit) in sorted(table.items()):
        assert (figure, word) == exposure(DEPLOY / name), name
        assert limit == EXPOSURE_LIMITS.get(name, EXPOSURE_LIMIT), name


def test_the_exposure_check_catches_a_unit_without_its_hardening(tmp_path: Path) -> None:
    # The batch unit as it was before the sandbox: only NoNewPrivileges, PrivateTmp and
    # ProtectSystem=full.
    sandbox = ("ProtectHome", "PrivateMounts", "PrivateDevices", "PrivateUsers", "DevicePolicy",
               "CapabilityBoundingSet", "RestrictSUIDSGID", "ProtectClock", "ProtectHostname",
               "ProtectKernel", "ProtectControlGroups", "ProtectProc", "RestrictNamespaces",
               "RestrictRealtime", "LockPersonality", "RemoveIPC", "UMask",
               "SystemCall", "RestrictAddressFamilies")
    bare = tmp_path / "nightdesk-batch.service"
    bare.write_text("\n".join(line for line in
                              (DEPLOY / "nightdesk-batch.service").read_text().splitlines()
                              if not line.startswith(sandbox))
                    .replace("ProtectSystem=strict", "ProtectSystem=full") + "\n")
    figure, _ = exposure(bare)
    assert figure > EXPOSURE_LIMIT, figure


def test_the_data_home_is_the_one_writable_place() -> None:
    # ProtectSystem=strict leaves only the StateDirectory= writable: the data home must be it.
    for path in UNITS:
        if path.suffix != ".service" or path.name.startswith("nightdesk-alert@"):
            continue
        service = parse_unit(path)["Service"]
        assert service["ProtectSystem"] == ["strict"], path.name
        assert service["StateDirectory"] == ["nightdesk"], path.name
        assert "NIGHTDESK_HOME=/var/lib/nightdesk" in service.get("Environment", []), path.name
        assert "ReadWritePaths" not in service, path.name


def test_the_timers_summer_time_note_holds() -> None:
    # deploy/README.md: 00:10 is clear of the clock changes of the EU, UK, US and Canada ...
    for name in ("Europe/Berlin", "Europe/London", "Europe/Helsinki", "America/New_York",
                 "America/Chicago", "America/Denver", "America/Los_Angeles",
                 "America/Anchorage", "America/Halifax", "America/St_Johns", "Pacific/Honolulu"):
        zone = ZoneInfo(name)
        for day in range(366 * 4):
            at = datetime(2026, 1, 1, 0, 10, tzinfo=zone) + timedelta(days=day)
            back = at.astimezone(ZoneInfo("UTC")).astimezone(zone)
            assert (back.hour, back.minute) == (0, 10), (name, at)  # it exists
            assert at.utcoffset() == at.replace(fold=1).utcoffset(), (name, at)  # once
    # ... and where clocks jump at midnight systemd skips the night: Chile, 5 September 2027.
    timer = parse_unit(DEPLOY / "nightdesk-batch.timer")["Timer"]["OnCalendar"][0]
    shown = subprocess.run([systemd_analyze(), "calendar", "--iterations=2",
                            "--base-time=2027-09-04 12:00 UTC", f"{timer} America/Santiago"],
                           capture_output=True, text=True, check=True).stdout
    fires = re.findall(r"(?:Next elapse|Iter\. #\d): \w+ (\S+ \S+) UTC", shown)
    assert fires == ["2027-09-06 03:10:00", "2027-09-07 03:10:00"], shown
