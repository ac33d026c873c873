"""Check the machine before a batch: the GPU (via nvidia-smi) or, without one, the CPU profile."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from serving.errors import reason
from serving.launcher import healthy
from serving.metrics import metrics_url
from serving.profiles import HostPaths, Profile, available, cpu_has_avx512, load_profile
from serving.router import parse_workers, workers_url
from serving.urls import redact

NVIDIA_SMI_QUERY = "name,compute_cap,memory.free,memory.total,pstate,power.draw"
# Memory another process holds before we start; above this the GPU counts as busy.
BUSY_USED_MIB = 2048
# A server's "not now" (HTTP 429 Too Many Requests, 503 Service Unavailable).
BUSY_STATUSES = (429, 503)

Level = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One line of the preflight report."""

    level: Level
    name: str
    detail: str

    def __post_init__(self) -> None:
        # Details quote the server's URLs (and httpx errors quote them again): never a password.
        object.__setattr__(self, "detail", redact(self.detail))


@dataclass(frozen=True)
class Gpu:
    """One row of nvidia-smi's CSV answer."""

    index: int
    name: str
    compute_cap: float | None
    memory_free_mib: float
    memory_total_mib: float
    pstate: str
    power_draw_w: float | None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]" on some boards
        return None


def parse_nvidia_smi(csv_text: str) -> list[Gpu]:
    """Parse ``--format=csv,noheader,nounits`` output for NVIDIA_SMI_QUERY."""
    gpus = []
    for index, line in enumerate(filter(None, map(str.strip, csv_text.splitlines()))):
        name, cap, free, total, pstate, power = (part.strip() for part in line.split(","))
        gpus.append(Gpu(index=index, name=name, compute_cap=_float(cap),
                        memory_free_mib=_float(free) or 0.0,
                        memory_total_mib=_float(total) or 0.0,
                        pstate=pstate, power_draw_w=_float(power)))
    return gpus


def query_gpus() -> list[Gpu] | None:
    """Return the GPUs nvidia-smi sees, or None when there is no usable nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out) or None


def check_gpus(gpus: list[Gpu], profile: Profile) -> list[Check]:
    """Judge each GPU against the profile: enough memory, free of other work, capable."""
    checks = []
    for gpu in gpus:
        label = f"gpu {gpu.index}"
        used = gpu.memory_total_mib - gpu.memory_free_mib
        power = "?" if gpu.power_draw_w is None else f"{gpu.power_draw_w:.0f} W"
        checks.append(Check("ok", label, f"{gpu.name}, compute {gpu.compute_cap}, "
                            f"{gpu.memory_free_mib / 1024:.1f}/{gpu.memory_total_mib / 1024:.1f} "
                            f"GiB free, {gpu.pstate}, {power}"))
        need = profile.min_gpu_memory_gib
        if need is not None and gpu.memory_total_mib / 1024 < need:
            checks.append(Check("fail", label, f"{gpu.memory_total_mib / 1024:.0f} GiB is too "
                                f"small for {profile.name} (needs {need:.0f} GiB)"))
        elif used > BUSY_USED_MIB:
            checks.append(Check("warn", label, f"busy: {used / 1024:.1f} GiB already in use by "
                                "another process; the server may not fit or will be slower"))
        cap = profile.min_compute_capability
        if cap is not None and gpu.compute_cap is not None and gpu.compute_cap < cap:
            checks.append(Check("warn", label, f"compute capability {gpu.compute_cap} < {cap}: "
                                f"{profile.name}'s weights decode without native kernels "
                                "(slower), if at all"))
    if profile.device == "gpu":
        checks.append(Check("ok", "vllm", f"{profile.name} needs vLLM {profile.vllm_version}"
                            + (f" ({profile.requirement_note})" if profile.requirement_note
                               else "")))
    return checks


# The CPU server's two set-up steps, beside this module in a checkout and in an installed
# wheel alike (the script ships as package data): advice names them where they are.
SETUP_SCRIPT = Path(__file__).with_name("setup-cpu-env.sh")
PREPARE_MODEL = Path(__file__).with_name("prepare_model.py")


def check_cpu_profile(profile: Profile, root: str, paths: HostPaths) -> list[Check]:
    """Check what the embedded CPU server needs: its venv, the prepared model, the server."""
    venv = paths.vllm_venv
    model = Path(profile.model_path(paths.models_dir))
    avx = cpu_has_avx512()
    checks = [
        Check("ok", "cpu", f"{os.cpu_count()} cores, "
              + ("AVX-512 (bfloat16)" if avx else "no AVX-512 (float32)")),
        Check("ok", "vllm env", str(venv)) if (venv / ".ready").exists()
        else Check("fail", "vllm env", f"{venv} not ready; build it with "
                   f"NIGHTDESK_VLLM_VENV={venv} bash {SETUP_SCRIPT}"),
        Check("ok", "model", str(model)) if (model / ".ready").exists()
        else Check("fail", "model", f"{model} not prepared; run "
                   f"{venv}/bin/python {PREPARE_MODEL} --out {model}"),
    ]
    kv = profile.env.get("VLLM_CPU_KVCACHE_SPACE")
    free = _available_gib()
    if kv is not None and free is not None and float(kv) + 2 > free:
        checks.append(Check("warn", "memory", f"{free:.1f} GiB available; the KV cache alone "
                            f"takes {kv} GiB (VLLM_CPU_KVCACHE_SPACE)"))
    checks.append(Check("ok", "server", f"{root} answers /health") if healthy(root)
                  else Check("warn", "server", f"{root} is not running; "
                             f"`nightdesk server start --profile {profile.name}`"))
    return checks


def _available_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024 / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def run_preflight(profile: Profile, root: str, gpus: list[Gpu] | None,
                  paths: HostPaths) -> list[Check]:
    """Return every check for this machine and profile (``gpus`` from ``query_gpus()``)."""
    if gpus is None:
        checks = [Check("ok" if profile.device == "cpu" else "fail", "gpu",
                        "no NVIDIA GPU (nvidia-smi not found or not answering)")]
        if profile.device == "gpu":
            checks.append(Check("warn", "profile", f"{profile.name} needs a GPU; "
                                "checking the embedded CPU profile instead"))
        cpu = profile if profile.device == "cpu" else load_profile("cpu-tiny")
        return checks + check_cpu_profile(cpu, root, paths)
    checks = check_gpus(gpus, profile)
    if profile.device == "cpu":
        gpu_profiles = [name for name in available() if load_profile(name).device == "gpu"]
        checks.append(Check("warn", "profile", "a GPU is present but the profile is "
                            f"{profile.name}; the GPU profiles: {', '.join(gpu_profiles)} "
                            "(--profile, or NIGHTDESK_SERVER_PROFILE)"))
        checks += check_cpu_profile(profile, root, paths)
    else:
        checks.append(Check("ok", "server", f"{root} answers /health") if healthy(root)
                      else Check("warn", "server", f"{root} is not answering yet"))
    return checks


def check_endpoint(base_url: str, model: str, api_key: str = "EMPTY", *,
                   timeout_s: float = 10.0, client: httpx.Client | None = None) -> Check:
    """Check that an OpenAI-compatible server answers at ``base_url`` and serves ``model``.

    What a batch checks before it writes anything: a server that is not there, refuses the
    key, or serves another model would otherwise fail every call of the night.
    """
    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"}
    try:
        if client is not None:
            response = client.get(url, headers=headers, timeout=timeout_s)
        else:
            with httpx.Client(timeout=timeout_s) as own:
                response = own.get(url, headers=headers)
    except httpx.HTTPError as error:
        return Check("fail", "server", f"cannot reach {url}: {reason(error)}")
    if response.status_code in (401, 403):
        return Check("fail", "server", f"{url} refused the API key (HTTP "
                     f"{response.status_code}): check NIGHTDESK_LLM_API_KEY")
    if response.status_code in BUSY_STATUSES:
        # The server is there and shedding load (a router with every worker busy, a
        # restart's first seconds): no verdict on the settings. Refusing the night here
        # would cost every ticker for an answer the night's own calls wait out
        # (back-pressure, up to the outage budget); the model goes unchecked until then.
        return Check("warn", "server", f"{url} answered HTTP {response.status_code} "
                     "(busy): the model is not checked; the night's calls wait it out")
    if response.status_code >= 500:
        return Check("fail", "server", f"{url} answered HTTP {response.status_code}: the "
                     "server, or a proxy before it, is failing; start the night once it "
                     "answers")
    if response.status_code != 200:
        return Check("fail", "server", f"{url} answered HTTP {response.status_code}: is "
                     "this an OpenAI-compatible server's /v1 URL?")
    try:
        served = [str(m["id"]) for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return Check("fail", "server", f"{url} did not answer with a model list")
    if model not in served:
        return Check("fail", "model", f"the server at {base_url} does not serve {model!r} "
                     f"(it serves: {', '.join(served) or 'nothing'}); set NIGHTDESK_LLM_MODEL")
    return Check("ok", "server", f"{base_url} serves {model}")


def check_load_readable(base_url: str, servers: Sequence[str] = (), *,
                        timeout_s: float = 10.0) -> Check:
    """Check that a night can read the load at ``base_url``: a router's ``/workers`` list
    (its servers are read), one of ``servers`` (``llm_router_servers``) or the endpoint
    itself answering ``/metrics``. A gateway that answers neither (404) fails every reading
    of the night: the endpoint reads as down and the night waits out its outage budget,
    then ends interrupted. Unreachable, or a 5xx, is no verdict: the night waits that out."""
    def status(url: str) -> int | str:
        try:
            return client.get(url).status_code
        except httpx.HTTPError as error:
            return reason(error)

    with httpx.Client(timeout=timeout_s) as client:
        if not servers:
            try:
                if parse_workers(client.get(workers_url(base_url))):
                    return Check("ok", "load", f"{base_url} is a router: its servers are read")
            except httpx.HTTPError:
                return Check("ok", "load", f"{base_url} not asked (not answering)")
        said = {url: status(metrics_url(url)) for url in servers}
        if 200 in said.values():
            return Check("ok", "load", "servers behind the router answer /metrics")
        front = status(metrics_url(base_url))
    if not isinstance(front, int) or front == 200 or front >= 500:
        return Check("ok", "load", f"{metrics_url(base_url)}: {front}")
    if servers:
        first = next(iter(said.items()))
        return Check("fail", "load", f"no server in NIGHTDESK_LLM_ROUTER_SERVERS answers "
                     f"/metrics ({metrics_url(first[0])}: {first[1]}) and "
                     f"{metrics_url(base_url)} answered HTTP {front}: the night could read "
                     "no load and would wait out NIGHTDESK_OUTAGE_BUDGET_S; name the vLLM "
                     "servers as this host reaches them")
    return Check("fail", "load", f"{metrics_url(base_url)} answered HTTP {front}: the night "
                 "reads the load there and would wait out NIGHTDESK_OUTAGE_BUDGET_S; behind a "
                 "gateway, name its vLLM servers in NIGHTDESK_LLM_ROUTER_SERVERS")
