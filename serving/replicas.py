"""Plan one vLLM server per GPU of a host: its GPU, its port, its own files.

``nightdesk server start --gpus 0,1`` runs the profile once per listed GPU, each process
seeing only its own (``CUDA_VISIBLE_DEVICES``), on consecutive ports from the base port.
Each is a separate server to the launcher, under its own key (``<profile>-gpu<N>``: its
pid, log and facts files). A manifest, ``<profile>.replicas.json`` in the state folder,
lists them, so ``server stop`` and ``server status`` find every one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from serving.errors import ProfileError, ServerError, reason
from serving.profiles import Profile, ServerCommand


@dataclass(frozen=True)
class Replica:
    """One server of several: the GPU it sees, its port, and the key naming its files."""

    gpu: str
    port: int
    key: str

    def base_url(self, host: str) -> str:
        return f"http://{host}:{self.port}/v1"


def parse_gpus(text: str) -> list[str]:
    """Read ``--gpus``: device indices separated by commas, e.g. ``0,1``; ValueError if not."""
    gpus = [part.strip() for part in text.split(",")]
    if not gpus or not all(gpu.isdigit() for gpu in gpus):
        raise ValueError(f"--gpus takes GPU indices separated by commas, e.g. 0,1 (got {text!r})")
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus lists a GPU twice ({text!r})")
    return gpus


def plan(profile: Profile, gpus: list[str], base_port: int) -> list[Replica]:
    """Return one replica per GPU on consecutive ports from ``base_port``."""
    if profile.device != "gpu":
        raise ProfileError(f"--gpus needs a GPU profile; {profile.name} runs on the CPU "
                           "(start it without --gpus)")
    if base_port + len(gpus) - 1 > 65535:
        raise ProfileError(f"ports {base_port}..{base_port + len(gpus) - 1} run past 65535")
    return [Replica(gpu, base_port + i, f"{profile.name}-gpu{gpu}")
            for i, gpu in enumerate(gpus)]


def on_gpu(command: ServerCommand, replica: Replica) -> ServerCommand:
    """Return the command with only the replica's GPU visible to it."""
    return ServerCommand(argv=list(command.argv),
                         env={**command.env, "CUDA_VISIBLE_DEVICES": replica.gpu})


def base_urls(host: str, replicas: list[Replica]) -> str:
    """Return the ``NIGHTDESK_LLM_BASE_URL`` value that lists every replica."""
    return ",".join(replica.base_url(host) for replica in replicas)


def manifest_path(profile: str, state_dir: Path) -> Path:
    return state_dir / f"{profile}.replicas.json"


def write_manifest(profile: str, replicas: list[Replica], state_dir: Path) -> Path:
    """Record the replicas started, for ``stop`` and ``status``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = manifest_path(profile, state_dir)
    path.write_text(json.dumps([asdict(r) for r in replicas], indent=2) + "\n")
    return path


def read_manifest(profile: str, state_dir: Path) -> list[Replica]:
    """Return the replicas recorded for ``profile`` (none when it was not started per GPU)."""
    path = manifest_path(profile, state_dir)
    try:
        data = json.loads(path.read_text())
        return [Replica(str(r["gpu"]), int(r["port"]), str(r["key"])) for r in data]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ServerError(f"unreadable replica list {path}: {reason(error)}") from None
