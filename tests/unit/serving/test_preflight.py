"""Judge GPUs from nvidia-smi's CSV against a profile; fall back to the CPU profile without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.preflight import (
    Check,
    check_cpu_profile,
    check_endpoint,
    check_gpus,
    parse_nvidia_smi,
    run_preflight,
)
from serving.profiles import HostPaths, load_profile

PATHS = HostPaths(models_dir=Path("/nonexistent/models"), vllm_venv=Path("/nonexistent/venv"))

DENSE = load_profile("qwen-dense-27b")
# Recorded shape of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`.
IDLE_5090 = "NVIDIA GeForce RTX 5090, 12.0, 31842, 32607, P8, 18.52\n"
BUSY_H200 = "NVIDIA H200, 9.0, 60000, 143771, P0, 412.10\n"
SMALL = "NVIDIA GeForce RTX 4090, 8.9, 24000, 24564, P8, [N/A]\n"


def _levels(checks: list[Check]) -> dict[str, str]:
    worst: dict[str, str] = {}
    order = {"ok": 0, "warn": 1, "fail": 2}
    for check in checks:
        if order[check.level] >= order[worst.get(check.name, "ok")]:
            worst[check.name] = check.level
    return worst


def test_parse_nvidia_smi_rows() -> None:
    gpus = parse_nvidia_smi(IDLE_5090 + SMALL)
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 4090"]
    assert gpus[0].compute_cap == 12.0
    assert gpus[0].memory_total_mib == 32607
    assert gpus[1].power_draw_w is None


def test_idle_5090_passes_the_dense_profile() -> None:
    assert _levels(check_gpus(parse_nvidia_smi(IDLE_5090), DENSE))["gpu 0"] == "ok"


def test_busy_gpu_warns() -> None:
    checks = check_gpus(parse_nvidia_smi(BUSY_H200), DENSE)
    assert any(c.level == "warn" and "busy" in c.detail for c in checks)
    assert any(c.level == "warn" and "compute capability 9.0" in c.detail for c in checks)


def test_too_small_gpu_fails() -> None:
    checks = check_gpus(parse_nvidia_smi(SMALL), DENSE)
    assert any(c.level == "fail" and "too small" in c.detail for c in checks)


def test_without_gpu_says_so_and_checks_the_cpu_profile() -> None:
    checks = run_preflight(load_profile("cpu-tiny"), "http://127.0.0.1:9", None,
                           PATHS)
    names = [c.name for c in checks]
    assert checks[0].name == "gpu" and "no NVIDIA GPU" in checks[0].detail
    assert {"vllm env", "model", "server"} <= set(names)


def test_cpu_checks_look_where_the_host_paths_say(tmp_path: Path) -> None:
    paths = HostPaths(models_dir=tmp_path / "models", vllm_venv=tmp_path / "venv")
    cpu = load_profile("cpu-tiny")
    levels = {c.name: c for c in check_cpu_profile(cpu, "http://127.0.0.1:9", paths)}
    assert levels["vllm env"].level == levels["model"].level == "fail"
    assert str(tmp_path / "models" / "smollm2-135m") in levels["model"].detail
    for ready in (tmp_path / "venv" / ".ready", tmp_path / "models" / "smollm2-135m" / ".ready"):
        ready.parent.mkdir(parents=True)
        ready.touch()
    levels = {c.name: c for c in check_cpu_profile(cpu, "http://127.0.0.1:9", paths)}
    assert levels["vllm env"].level == levels["model"].level == "ok"


def test_gpu_profile_without_gpu_fails_and_checks_cpu_instead() -> None:
    checks = run_preflight(DENSE, "http://127.0.0.1:9", None, PATHS)
    assert checks[0].level == "fail"
    assert "vllm env" in [c.name for c in checks]


def test_an_endpoint_not_there_is_said_without_the_errno() -> None:
    # A dead port (9 is discard, never listening here) and a name no resolver knows: the
    # operator's line says the reason, not the C library's "[Errno 111] ".
    for base_url, reason in (("http://127.0.0.1:9/v1", "Connection refused"),
                             ("http://nightdesk-no-such-host.invalid:8000/v1", None)):
        check = check_endpoint(base_url, "m", timeout_s=5)
        assert check.level == "fail" and check.detail.startswith(
            f"cannot reach {base_url}/models: "), check.detail
        assert "[Errno" not in check.detail, check.detail
        if reason:
            assert check.detail.endswith(reason), check.detail


def test_the_set_up_advice_names_files_there_from_any_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An installed host has no checkout to run `serving/...` from: the advice names the
    # script and the converter where they are (the installed package, or the checkout).
    monkeypatch.chdir(tmp_path)
    cpu = load_profile("cpu-tiny")
    paths = HostPaths(models_dir=tmp_path / "models", vllm_venv=tmp_path / "venv")
    said = {c.name: c.detail for c in check_cpu_profile(cpu, "http://127.0.0.1:9", paths)}
    build = said["vllm env"].split("build it with ")[1].split()
    assert build[:2] == [f"NIGHTDESK_VLLM_VENV={tmp_path / 'venv'}", "bash"], said
    assert Path(build[2]).is_file(), said
    prepare = said["model"].split("; run ")[1].split()
    assert prepare[0] == str(tmp_path / "venv" / "bin" / "python")
    assert Path(prepare[1]).is_file() and prepare[2:] == [
        "--out", str(tmp_path / "models" / "smollm2-135m")], said


def test_a_cpu_profile_on_a_gpu_names_the_gpu_profiles() -> None:
    checks = run_preflight(load_profile("cpu-tiny"), "http://127.0.0.1:9",
                           parse_nvidia_smi(IDLE_5090), PATHS)
    [warned] = [c.detail for c in checks if c.name == "profile"]
    named = warned.split("the GPU profiles: ")[1].split(" (")[0].split(", ")
    assert "qwen-dense-27b" in named
    assert all(load_profile(name).device == "gpu" for name in named), warned
