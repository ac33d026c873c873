"""Start, watch and stop the co-located vLLM server as a detached process with a pid file.

Each profile has its own files in the state folder the caller names (nightdesk passes the
setting ``server_dir``): ``<profile>.log`` (the server's output), ``<profile>.pid`` and
``<profile>.facts.json`` (see serving/facts.py). A server of several on one host (one per
GPU, serving/replicas.py) passes its own ``key`` instead of the profile's name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import httpx

from serving.errors import ServerError, reason
from serving.facts import live_facts, parse_startup_log, read_server_facts, write_facts
from serving.profiles import Profile, ServerCommand

# Measured: ~2 minutes to /health on 2 cores (load, KV allocation, warm-up); leave room.
DEFAULT_START_TIMEOUT_S = 600.0
DEFAULT_STOP_TIMEOUT_S = 30.0
POLL_S = 1.0
TAIL_LINES = 25

Progress = Callable[[float, str], None]
"""Called about once a second while starting: seconds elapsed, the log's last line."""

# Servers this process started, so stop() can reap them instead of leaving zombies.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ServerFiles:
    """Where one profile's server keeps its log, pid and facts."""

    log: Path
    pid: Path

    @classmethod
    def of(cls, profile: str, state_dir: Path) -> ServerFiles:
        return cls(log=state_dir / f"{profile}.log", pid=state_dir / f"{profile}.pid")


@dataclass(frozen=True)
class ServerStatus:
    """What ``nightdesk server status`` reports."""

    profile: str
    pid: int | None
    alive: bool
    healthy: bool
    root_url: str
    log: Path


def root_url(host: str, port: int) -> str:
    return f"http://{host}:{port}"


def healthy(root: str, timeout_s: float = 2.0) -> bool:
    """Tell whether the server at ``root`` answers /health with 200."""
    try:
        return httpx.get(f"{root}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """Return the last lines of a log (empty when there is none)."""
    try:
        with path.open(errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except OSError:
        return ""


def _last_line(path: Path) -> str:
    # Only the tail end of a long log; vLLM writes a few hundred lines while starting.
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - 4096))
            chunk = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return chunk[-1].strip() if chunk else ""


def _read_pid(files: ServerFiles) -> int | None:
    try:
        return int(files.pid.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Tell whether ``pid`` is our server: alive and leader of its own process group."""
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
        # start_new_session made the server a group leader; a recycled pid rarely is.
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    child = _children.get(pgid)
    if child is not None:
        child.poll()  # reap the leader if it is done, or it lingers as a zombie
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _child_env(command: ServerCommand, api_key: str | None) -> dict[str, str]:
    env = {**os.environ, **command.env, "PYTHONUNBUFFERED": "1"}
    # The key rides in the environment, not argv, so `ps` does not show it.
    env.pop("VLLM_API_KEY", None)
    if api_key and api_key != "EMPTY":
        env["VLLM_API_KEY"] = api_key
    return env


def status(profile: Profile, *, state_dir: Path, port: int | None = None,
           key: str | None = None) -> ServerStatus:
    """Report whether this profile's server (or its replica ``key``) runs and answers /health."""
    files = ServerFiles.of(key or profile.name, state_dir)
    pid = _read_pid(files)
    root = root_url(profile.host, port or profile.port)
    return ServerStatus(
        profile=key or profile.name,
        pid=pid,
        alive=pid is not None and _alive(pid),
        healthy=healthy(root),
        root_url=root,
        log=files.log,
    )


def start(
    profile: Profile,
    *,
    port: int | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    state_dir: Path,
    command: ServerCommand,
    progress: Progress | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """Run ``command`` (the rendered profile) detached, wait for /health, return its facts.

    The facts (see serving/facts.py) are also written to ``state_dir``.

    A server of this profile that already runs and answers is left alone (its facts are
    returned with ``already_running``). One that exits or misses the deadline is a
    ServerError carrying the log's last lines; a late one is stopped first.
    """
    port = port or profile.port
    root = root_url(profile.host, port)
    name = key or profile.name
    files = ServerFiles.of(name, state_dir)
    running = status(profile, port=port, state_dir=state_dir, key=key)
    if running.alive and running.healthy:
        return {**read_server_facts(name, state_dir), "already_running": True}
    if running.alive:
        raise ServerError(f"{name} server (pid {running.pid}) runs but {root}/health "
                          f"does not answer (still starting?); see {files.log} or run "
                          "`nightdesk server stop`")
    if running.healthy:
        raise ServerError(f"another server already answers on {root}; stop it or pick --port")

    state_dir.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    t0 = time.monotonic()
    with files.log.open("wb") as log:
        try:
            child = subprocess.Popen(
                command.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=_child_env(command, api_key), start_new_session=True,
            )
        except OSError as error:
            raise ServerError(f"cannot run {command.argv[0]}: {reason(error)}") from None
    _children[child.pid] = child
    files.pid.write_text(f"{child.pid}\n")

    try:
        _wait_healthy(child, root, files, t0, timeout_s, progress)
    except BaseException:
        # Covers the deadline and Ctrl-C alike: never leave a half-started server behind.
        stop(profile, state_dir=state_dir, timeout_s=10.0, key=key)
        raise

    facts: dict[str, Any] = {
        "profile": profile.name,
        "served_model_name": profile.served_model_name,
        # The exact command (and so the model path) the numbers below belong to; no secrets.
        "command": command.shell(),
        "root_url": root,
        "max_model_len": profile.max_model_len,
        "max_num_seqs": profile.max_num_seqs,
        "pid": child.pid,
        "started_at": started_at.isoformat(),
        "startup_s": round(time.monotonic() - t0, 1),
        **parse_startup_log(files.log.read_text(errors="replace")),
    }
    with contextlib.suppress(ServerError):
        facts.update(live_facts(root))
    write_facts(name, facts, state_dir)
    return facts


def exec_foreground(profile: Profile, *, command: ServerCommand,
                    api_key: str | None = None) -> NoReturn:
    """Replace this process with the server, for a supervisor (systemd) that watches its pid.

    No pid file, no log file and no wait: the supervisor owns the process and its output,
    and a health wait is a separate step (``wait_until_healthy``).
    """
    try:
        os.execvpe(command.argv[0], command.argv, _child_env(command, api_key))
    except OSError as error:
        raise ServerError(f"cannot run {command.argv[0]}: {reason(error)}") from None


def wait_until_healthy(root: str, timeout_s: float, poll_s: float = POLL_S) -> float:
    """Poll ``root``/health until it answers 200; return the seconds waited.

    A server that does not answer within ``timeout_s`` is a ServerError.
    """
    t0 = time.monotonic()
    while not healthy(root):
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            raise ServerError(f"{root}/health did not answer within {timeout_s:.0f}s")
        time.sleep(poll_s)
    return time.monotonic() - t0


def _wait_healthy(child: subprocess.Popen[bytes], root: str, files: ServerFiles, t0: float,
                  timeout_s: float, progress: Progress | None) -> None:
    while True:
        code = child.poll()
        if code is not None:
            raise ServerError(f"server exited with code {code} during start-up; "
                              f"last lines of {files.log}:\n{tail(files.log)}")
        if healthy(root):
            return
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            raise ServerError(f"server not healthy after {timeout_s:.0f}s; "
                              f"last lines of {files.log}:\n{tail(files.log)}")
        if progress is not None:
            progress(elapsed, _last_line(files.log))
        time.sleep(POLL_S)


def stop(profile: Profile, *, state_dir: Path,
         timeout_s: float = DEFAULT_STOP_TIMEOUT_S, key: str | None = None) -> bool:
    """Stop this profile's server (or its replica ``key``): SIGTERM its process group,
    SIGKILL after the deadline.

    Return False when no such server was running here.
    """
    files = ServerFiles.of(key or profile.name, state_dir)
    pid = _read_pid(files)
    # A leader that died can leave its engine core running in the group: that counts too.
    if pid is None or not (_alive(pid) or _group_alive(pid)):
        files.pid.unlink(missing_ok=True)
        return False
    # vLLM runs its engine core in a child process; the whole group must go.
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pid):
        _signal_group(pid, signal.SIGKILL)
        while _group_alive(pid) and time.monotonic() < deadline + 10:
            time.sleep(0.2)
    child = _children.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1)
    files.pid.unlink(missing_ok=True)
    return True
