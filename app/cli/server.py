"""``nightdesk server command|start|stop|status|facts`` and ``nightdesk preflight``."""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from app.cli.common import setup
from app.cli.logs import console
from app.config import Settings
from app.errors import InputError, ServerError
from serving import launcher, replicas, router
from serving.facts import read_server_facts
from serving.preflight import query_gpus, run_preflight
from serving.profiles import HostPaths, Profile, load_profile, render
from serving.urls import redact, server_root

# vllm-router answers /health within seconds of starting, vLLM servers in minutes.
ROUTER_START_S = 60.0

app = typer.Typer(no_args_is_help=True, help="Run the co-located vLLM server from a profile.")
out = console()
err = console(stderr=True)

ProfileOpt = Annotated[
    str | None, typer.Option("--profile", "-p", help="server profile (default: settings)")
]
PortOpt = Annotated[
    int | None, typer.Option("--port", min=1, max=65535,
                              help="port (default: from NIGHTDESK_LLM_BASE_URL)")
]


GpusOpt = Annotated[str | None, typer.Option(
    "--gpus", help="one server per GPU, e.g. 0,1: each sees only its GPU "
                   "(CUDA_VISIBLE_DEVICES), on consecutive ports from --port")]

RouterOpt = Annotated[bool, typer.Option(
    "--router", help="with --gpus: also start vllm-router (pip install 'nightdesk[router]') "
                     "in front of the servers, and point nightdesk at it")]
RouterPortOpt = Annotated[int | None, typer.Option(
    "--router-port", min=1, max=65535,
    help="the router's port (default: the one after the last server's)")]

ModelOpt = Annotated[str | None, typer.Option(help="checkpoint folder or HF id")]
StartTimeoutOpt = Annotated[float, typer.Option(min=0, help="seconds to wait for /health")]
ArgOpt = Annotated[list[str] | None, typer.Option(
    "--arg", help="override a profile server argument: FLAG=VALUE (repeatable), "
                  "e.g. --arg enable-prefix-caching=false")]


def _profile(settings: Settings, name: str | None, overrides: list[str] | None = None
             ) -> Profile:
    """Load the profile, with ``FLAG=VALUE`` overrides of its server arguments applied."""
    profile = load_profile(name or settings.llm.server_profile)
    if not overrides:
        return profile
    args = dict(profile.args)
    for item in overrides:
        flag, sep, raw = item.partition("=")
        if not sep or not flag.strip():
            raise InputError(f"--arg takes FLAG=VALUE, e.g. enable-prefix-caching=false "
                             f"(got {item!r})")
        lowered = raw.strip().lower()
        value: bool | int | str = (True if lowered == "true" else False if lowered == "false"
                                   else int(raw) if raw.strip().isdigit() else raw)
        args[flag.strip().lstrip("-")] = value
    return profile.model_copy(update={"args": args})


def _paths(settings: Settings) -> HostPaths:
    """Return where this host keeps model folders and the CPU server's venv (settings)."""
    return HostPaths(models_dir=settings.paths.models_dir, vllm_venv=settings.paths.vllm_venv)


def _replicas(profile: Profile, gpus: str, port: int) -> list[replicas.Replica]:
    """Plan ``--gpus``: one server per GPU from ``port`` up; bad input is one line."""
    try:
        chosen = replicas.parse_gpus(gpus)
    except ValueError as error:
        raise InputError(str(error)) from None
    return replicas.plan(profile, chosen, port)


def _port(settings: Settings, profile: Profile, port: int | None) -> int:
    """Pick the port: explicit, else the one nightdesk's client will call, else the profile's."""
    if port is not None:
        return port
    url = urlsplit(settings.llm.url)
    if url.hostname in ("127.0.0.1", "localhost") and url.port:
        return url.port
    return profile.port


@app.command("command")
def command(
    profile: ProfileOpt = None,
    port: PortOpt = None,
    model: ModelOpt = None,
    arg: ArgOpt = None,
    gpus: GpusOpt = None,
) -> None:
    """Print the shell command that starts the server for a profile (one line per GPU)."""
    settings = setup()
    chosen = _profile(settings, profile, arg)
    base = _port(settings, chosen, port)
    if gpus is None:
        lines = [render(chosen, _paths(settings), port=base, model=model)]
    else:
        lines = [replicas.on_gpu(render(chosen, _paths(settings), port=r.port, model=model), r)
                 for r in _replicas(chosen, gpus, base)]
    for line in lines:
        out.print(line.shell(), highlight=False, soft_wrap=True, markup=False)


@app.command("start")
def start(
    profile: ProfileOpt = None,
    port: PortOpt = None,
    timeout: StartTimeoutOpt = launcher.DEFAULT_START_TIMEOUT_S,
    arg: ArgOpt = None,
    model: ModelOpt = None,
    foreground: Annotated[bool, typer.Option(
        "--foreground", help="become the server process (for systemd): no pid file, output "
                             "to this terminal or the journal, no health wait")] = False,
    gpus: GpusOpt = None,
    with_router: RouterOpt = False,
    router_port: RouterPortOpt = None,
) -> None:
    """Start the server detached, wait until it is healthy and print its startup facts."""
    settings = setup()
    chosen = _profile(settings, profile, arg)
    chosen_port = _port(settings, chosen, port)
    if (with_router or router_port is not None) and gpus is None:
        raise InputError("--router starts vllm-router in front of one server per GPU: "
                         "give --gpus too")
    if chosen.served_model_name != settings.llm.model:
        err.print(f"[yellow]warning:[/] the server will serve {chosen.served_model_name!r} "
                  f"but NIGHTDESK_LLM_MODEL is {settings.llm.model!r}")
    if gpus is not None:
        if foreground:
            raise InputError("--foreground runs one server; for one per GPU under systemd, "
                             "give each unit its own CUDA_VISIBLE_DEVICES and --port")
        planned = _replicas(chosen, gpus, chosen_port)
        # Found before any server starts: a missing binary is one line, nothing to undo.
        binary = router.find_binary() if with_router else None
        _start_replicas(settings, chosen, planned, timeout, model, quiet=binary is not None)
        if binary is not None:
            _start_router(settings, chosen, planned, binary,
                          router_port or planned[-1].port + 1)
        return
    rendered = render(chosen, _paths(settings), port=chosen_port, model=model)
    if foreground:
        launcher.exec_foreground(chosen, command=rendered,
                                 api_key=settings.llm.api_key.get_secret_value())
    with err.status(f"starting {chosen.name} on port {chosen_port}") as line:

        def progress(elapsed: float, last: str) -> None:
            line.update(f"starting {chosen.name}: waiting for /health ({elapsed:.0f}s) "
                        f"[dim]{last[-100:]}[/]")

        facts = launcher.start(
            chosen, port=chosen_port, timeout_s=timeout, progress=progress,
            api_key=settings.llm.api_key.get_secret_value(), state_dir=settings.paths.server_dir,
            command=rendered,
        )
    files = launcher.ServerFiles.of(chosen.name, settings.paths.server_dir)
    if facts.get("already_running"):
        out.print(f"{chosen.name} already running on port {chosen_port}")
        return
    out.print(f"[green]{chosen.name} healthy[/] on {facts['root_url']} after "
              f"{facts['startup_s']:.0f}s (pid {facts['pid']}, log {files.log})")
    _print_facts(facts)


def _start_router(settings: Settings, profile: Profile, planned: list[replicas.Replica],
                  binary: str, port: int) -> None:
    """Start vllm-router in front of the servers just started; on a failure stop them all."""
    key = router.router_key(profile.name)
    command = router.router_command(binary, profile.host, port,
                                    [launcher.root_url(profile.host, r.port) for r in planned])
    try:
        with err.status(f"starting vllm-router on port {port}"):
            facts = launcher.start(profile, port=port, timeout_s=ROUTER_START_S, key=key,
                                   state_dir=settings.paths.server_dir, command=command)
    except BaseException:
        for replica in planned:
            launcher.stop(profile, state_dir=settings.paths.server_dir, key=replica.key)
        replicas.manifest_path(profile.name, settings.paths.server_dir).unlink(missing_ok=True)
        raise
    _print_started(settings, key, facts,
                   f"in front of {len(planned)} servers ({router.POLICY}, pid")
    out.print("point nightdesk at the router:", highlight=False)
    out.print(f"NIGHTDESK_LLM_BASE_URL={launcher.root_url(profile.host, port)}/v1",
              highlight=False, soft_wrap=True, markup=False)


def _print_started(settings: Settings, key: str, facts: dict[str, Any], what: str) -> None:
    """Print that a server or router answers, where, with ``what`` it is, its pid and log."""
    state = "already running" if facts.get("already_running") else "healthy"
    log_file = launcher.ServerFiles.of(key, settings.paths.server_dir).log
    out.print(f"[green]{key} {state}[/] on {facts.get('root_url', '')} {what} "
              f"{facts.get('pid')}, log {log_file})")


def _start_replicas(settings: Settings, profile: Profile, planned: list[replicas.Replica],
                    timeout: float, model: str | None, *, quiet: bool = False) -> None:
    """Start one server per GPU, one after another; on a failure stop those started."""
    started: list[replicas.Replica] = []
    try:
        for replica in planned:
            command = replicas.on_gpu(render(profile, _paths(settings), port=replica.port,
                                             model=model), replica)
            with err.status(f"starting {replica.key} on port {replica.port}"):
                facts = launcher.start(
                    profile, port=replica.port, timeout_s=timeout, key=replica.key,
                    api_key=settings.llm.api_key.get_secret_value(),
                    state_dir=settings.paths.server_dir, command=command)
            started.append(replica)
            _print_started(settings, replica.key, facts, f"(GPU {replica.gpu}, pid")
    except BaseException:
        for replica in started:
            launcher.stop(profile, state_dir=settings.paths.server_dir, key=replica.key)
        raise
    replicas.write_manifest(profile.name, planned, settings.paths.server_dir)
    if quiet:  # a router goes in front: its URL is the one to use
        return
    out.print("point nightdesk at all of them:", highlight=False)
    out.print(f"NIGHTDESK_LLM_BASE_URL={replicas.base_urls(profile.host, planned)}",
              highlight=False, soft_wrap=True, markup=False)


def _print_facts(facts: dict[str, object]) -> None:
    shown = ("vllm_version", "weights_gib", "kv_cache_memory_gib", "kv_cache_tokens",
             "max_concurrency_at_tokens", "max_concurrency", "engine_init_s")
    for key in shown:
        if key in facts:
            out.print(f"  {key}: {facts[key]}", highlight=False)


@app.command("stop")
def stop(
    profile: ProfileOpt = None,
    timeout: Annotated[float, typer.Option(min=0, help="seconds before SIGKILL")] =
    launcher.DEFAULT_STOP_TIMEOUT_S,
) -> None:
    """Stop the server, and every one started per GPU (SIGTERM, then SIGKILL after the timeout)."""
    settings = setup()
    chosen = _profile(settings, profile)
    with err.status(f"stopping {chosen.name}"):
        stopped = launcher.stop(chosen, timeout_s=timeout, state_dir=settings.paths.server_dir)
    out.print(f"{chosen.name} stopped" if stopped else f"{chosen.name} was not running")
    # The router first: nothing is sent on to servers being stopped.
    key = router.router_key(chosen.name)
    if launcher.stop(chosen, timeout_s=timeout, state_dir=settings.paths.server_dir, key=key):
        out.print(f"{key} stopped")
    planned = replicas.read_manifest(chosen.name, settings.paths.server_dir)
    for replica in planned:
        with err.status(f"stopping {replica.key}"):
            stopped = launcher.stop(chosen, timeout_s=timeout, state_dir=settings.paths.server_dir,
                                    key=replica.key)
        out.print(f"{replica.key} stopped" if stopped else f"{replica.key} was not running")
    replicas.manifest_path(chosen.name, settings.paths.server_dir).unlink(missing_ok=True)


@app.command("status")
def status(profile: ProfileOpt = None, port: PortOpt = None) -> None:
    """Say whether the server (or each one per GPU) runs and answers /health; and the
    router in front, with the servers behind it (its /workers, or the setting).

    Exit 1 when one does not answer.
    """
    settings = setup()
    chosen = _profile(settings, profile)
    planned = replicas.read_manifest(chosen.name, settings.paths.server_dir)
    states = ([launcher.status(chosen, port=r.port, state_dir=settings.paths.server_dir, key=r.key)
               for r in planned] if planned else
              [launcher.status(chosen, port=_port(settings, chosen, port),
                               state_dir=settings.paths.server_dir)])
    for state in states:
        _print_running(state.profile, state)
        out.print(f"{state.root_url}/health: {_health(state.healthy)}")
    silent = [state.root_url for state in states if not state.healthy]
    silent += _router_status(settings, chosen)
    if silent:
        raise ServerError(f"{', '.join(silent)}: /health does not answer")


def _print_running(name: str, state: launcher.ServerStatus) -> None:
    out.print(f"{name}: {f'running (pid {state.pid})' if state.alive else 'not running here'}; "
              f"log {state.log}")


def _health(healthy: bool) -> str:
    return "[green]healthy[/]" if healthy else "[red]not answering[/]"


def _router_status(settings: Settings, profile: Profile) -> list[str]:
    """Print the router in front (started here by ``--router``, else the one nightdesk is
    pointed at) and each server behind it; return the roots that do not answer /health.

    A URL nightdesk is pointed at is a router when the setting names servers behind it or
    it answers vllm-router's ``/workers``; anything else prints nothing here.
    """
    key = router.router_key(profile.name)
    facts = read_server_facts(key, settings.paths.server_dir)
    started = launcher.ServerFiles.of(key, settings.paths.server_dir).pid.exists()
    if started and isinstance(facts.get("root_url"), str):
        root = str(facts["root_url"])
    elif len(settings.llm.urls) == 1:
        root = server_root(settings.llm.url)
    else:
        return []  # nightdesk's own list of servers, each one shown above if started here
    try:
        workers = router.fetch_workers(root, timeout_s=2.0)
    except ServerError:
        workers = None  # a router that does not answer: its /health says so below
    named = settings.llm.router_urls
    if not (started or named or workers):
        return []
    where = "from its /workers"
    if named:
        where = "from NIGHTDESK_LLM_ROUTER_SERVERS"
    elif workers is None:
        where = "its /workers does not answer"
    if started:
        _print_running(key, launcher.status(profile, port=urlsplit(root).port, key=key,
                                            state_dir=settings.paths.server_dir))
    else:
        out.print(f"router {redact(root)} (NIGHTDESK_LLM_BASE_URL)", highlight=False)
    healthy = launcher.healthy(root)
    out.print(f"{redact(root)}/health: {_health(healthy)}", highlight=False)
    silent = [] if healthy else [redact(root)]
    verdicts = {w.url: w.healthy for w in workers or []}
    servers = [server_root(url) for url in named] if named else list(verdicts)
    out.print(f"servers behind it ({where}): {len(servers)}")
    for url in servers:
        said = verdicts.get(url)
        says = ("" if said is None else
                "router says [green]healthy[/]; " if said else "router says [red]unhealthy[/]; ")
        up = launcher.healthy(url)
        out.print(f"  {redact(url)}: {says}/health {_health(up)}", highlight=False)
        if not up:
            silent.append(redact(url))
    return silent


@app.command("wait")
def wait(
    profile: ProfileOpt = None,
    port: PortOpt = None,
    timeout: StartTimeoutOpt = launcher.DEFAULT_START_TIMEOUT_S,
) -> None:
    """Wait until the server answers /health (exit 1 after the timeout): a start-up check."""
    settings = setup()
    chosen = _profile(settings, profile)
    root = launcher.root_url(chosen.host, _port(settings, chosen, port))
    waited = launcher.wait_until_healthy(root, timeout)
    out.print(f"{root}/health: healthy after {waited:.0f}s")


@app.command("facts")
def facts(profile: ProfileOpt = None) -> None:
    """Print the startup facts recorded when the server last started here (JSON)."""
    settings = setup()
    chosen = _profile(settings, profile)
    out.print_json(json.dumps(read_server_facts(chosen.name, settings.paths.server_dir)))


def preflight(profile: ProfileOpt = None) -> None:
    """Check the GPU (or, without one, the CPU profile) before a batch; exit 1 on a failure."""
    settings = setup()
    chosen = _profile(settings, profile)
    root = server_root(settings.llm.url)
    checks = run_preflight(chosen, root, query_gpus(), _paths(settings))
    style = {"ok": "green", "warn": "yellow", "fail": "red"}
    for check in checks:
        out.print(f"[{style[check.level]}]{check.level:>4}[/]  {check.name}: {check.detail}",
                  highlight=False)
    failed = [check.name for check in checks if check.level == "fail"]
    if failed:
        raise ServerError(f"preflight failed: {', '.join(failed)}")
