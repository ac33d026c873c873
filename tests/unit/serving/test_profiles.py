"""Render the stored server profiles into command lines."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from serving.errors import ProfileError
from serving.profiles import PROFILE_DIR, HostPaths, available, load_profile, render

# Where a host keeps models and the CPU server's venv; no such folders exist here.
PATHS = HostPaths(models_dir=Path("/srv/nd/models"), vllm_venv=Path("/srv/nd/venv-vllm"))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_all_three_profiles_are_stored() -> None:
    assert {"cpu-tiny", "qwen-dense-27b", "qwen-moe-35b-a3b"} <= set(available())


def test_dense_profile_renders_the_seeds_setting() -> None:
    argv = render(load_profile("qwen-dense-27b"), PATHS).argv
    assert argv[:2] == ["vllm", "serve"]
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert _flag(argv, "--max-model-len") == "34816"
    assert _flag(argv, "--max-num-seqs") == "8"
    assert _flag(argv, "--gpu-memory-utilization") == "0.95"
    assert json.loads(_flag(argv, "--speculative-config")) == {
        "method": "mtp", "num_speculative_tokens": 2}
    assert json.loads(_flag(argv, "--default-chat-template-kwargs")) == {
        "enable_thinking": False}
    assert "--enable-prefix-caching" in argv
    assert _flag(argv, "--host") == "127.0.0.1"


def test_gpu_profiles_state_the_vllm_they_need() -> None:
    for name in ("qwen-dense-27b", "qwen-moe-35b-a3b"):
        profile = load_profile(name)
        assert profile.vllm_version == ">=0.28"
        assert "RTX 5090" in profile.requirement_note


def test_every_profile_streams_tokens_16_at_a_time() -> None:
    # One client reads every stream of a night; per-token chunks cost it its event loop.
    for name in ("cpu-tiny", "qwen-dense-27b", "qwen-moe-35b-a3b", "qwen-moe-35b-a3b-h200"):
        assert _flag(render(load_profile(name), PATHS).argv, "--stream-interval") == "16"


def test_moe_profile_has_14_slots_and_the_same_kv_and_length() -> None:
    argv = render(load_profile("qwen-moe-35b-a3b"), PATHS).argv
    assert _flag(argv, "--max-num-seqs") == "14"
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert _flag(argv, "--max-model-len") == "34816"


def test_h200_moe_profile_quantizes_the_weights_to_fp8_as_measured() -> None:
    profile = load_profile("qwen-moe-35b-a3b-h200")
    argv = render(profile, PATHS).argv
    assert _flag(argv, "--quantization") == "fp8"
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert _flag(argv, "--max-num-seqs") == "256"
    # The same served name as the RTX 5090's MoE profile: a night's model setting carries over.
    assert profile.served_model_name == load_profile("qwen-moe-35b-a3b").served_model_name


def test_cpu_profile_uses_the_module_entry_point_and_the_local_model() -> None:
    command = render(load_profile("cpu-tiny"), PATHS, port=8123, avx512=False)
    argv = command.argv
    assert argv[0] == "/srv/nd/venv-vllm/bin/python"
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == "/srv/nd/models/smollm2-135m"
    assert _flag(argv, "--served-model-name") == "smollm2-135m"
    assert _flag(argv, "--port") == "8123"
    assert _flag(argv, "--dtype") == "float32"
    assert "VLLM_CPU_KVCACHE_SPACE" in command.env


def test_relative_host_paths_become_absolute(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a checkout's defaults: var/models and .venv-vllm
    argv = render(load_profile("cpu-tiny"), HostPaths(Path("var/models"), Path(".venv-vllm")),
                  avx512=False).argv
    assert argv[0] == f"{tmp_path}/.venv-vllm/bin/python"
    assert _flag(argv, "--model") == f"{tmp_path}/var/models/smollm2-135m"


def test_gpu_model_is_a_local_folder_only_when_one_exists(tmp_path: Path) -> None:
    paths = HostPaths(models_dir=tmp_path, vllm_venv=tmp_path / "venv")
    dense = load_profile("qwen-dense-27b")
    assert render(dense, paths).argv[2] == "Qwen/Qwen3.8-27B-NVFP4"  # a Hugging Face id
    (tmp_path / "Qwen" / "Qwen3.8-27B-NVFP4").mkdir(parents=True)
    assert render(dense, paths).argv[2] == f"{tmp_path}/Qwen/Qwen3.8-27B-NVFP4"


def test_cpu_profile_uses_bfloat16_with_avx512() -> None:
    argv = render(load_profile("cpu-tiny"), PATHS, avx512=True).argv
    assert _flag(argv, "--dtype") == "bfloat16"


def test_shell_line_round_trips_through_shlex() -> None:
    command = render(load_profile("qwen-dense-27b"), PATHS, model="/models/x y")
    words = shlex.split(command.shell())
    assert words == command.argv
    assert words[2] == "/models/x y"


def test_false_flag_renders_as_no_flag(tmp_path: Path) -> None:
    text = (PROFILE_DIR / "cpu-tiny.toml").read_text()
    (tmp_path / "cpu-tiny.toml").write_text(
        text.replace("enable-prefix-caching = true", "enable-prefix-caching = false"))
    argv = render(load_profile("cpu-tiny", tmp_path), PATHS).argv
    assert "--no-enable-prefix-caching" in argv


def test_unknown_profile_is_one_line_profile_error() -> None:
    with pytest.raises(ProfileError, match="unknown server profile 'nope'") as caught:
        load_profile("nope")
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 2  # the user's choice, like bad input


def test_malformed_profile_is_profile_error(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('name = "bad"\ndevice = "tpu"\n')
    with pytest.raises(ProfileError, match=r"bad\.toml"):
        load_profile("bad", tmp_path)
