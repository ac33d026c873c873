"""deploy/README.md's uninstall steps undo what its install steps made: every unit stopped and
disabled, every file, folder, user and database removed (the data only on request, but named).

Read from the README's own shell blocks, so an install step added without its undoing fails.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata as md
import os
import re
import shlex
import subprocess
import sys
import tomllib
from itertools import pairwise
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
README = DEPLOY / "README.md"
UNIT_DIR = "/etc/systemd/system/"
STATE_DIR = "/var/lib/nightdesk"  # the units' StateDirectory=nightdesk
VENV_BIN = "/opt/nightdesk/venv/bin/"


def section(title: str) -> str:
    text = README.read_text()
    found = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert found, f"deploy/README.md has no section '## {title}'"
    return found.group(1)


def commands(text: str) -> list[list[str]]:
    """Every command of the section's ```sh blocks, as argv (comments dropped, `;` split)."""
    argvs = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            argv: list[str] = []
            for token in [*lexer, ";"]:
                if token in (";", "&&", "||"):
                    argvs += [argv] if argv else []
                    argv = []
                else:
                    argv.append(token)
    return argvs


def blocks(text: str) -> list[list[list[str]]]:
    """The section's ```sh blocks, each as its commands (``commands``)."""
    return [commands(f"```sh\n{block}```\n")
            for block in re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]


def executables(extras: set[str]) -> set[str]:
    """What ``pip install 'nightdesk[EXTRAS]'`` puts in the venv's bin/: nightdesk's own
    scripts and those of the extras' packages (as installed here, where `make setup` put
    every extra the units name)."""
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    found = set(project["scripts"])
    for extra in extras:
        for requirement in project["optional-dependencies"][extra]:
            name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)  # type: ignore[union-attr]
            found |= {Path(str(f)).name for f in md.files(name) or []
                      if Path(str(f)).parent.name == "bin"}
    return found


def made_by(install: list[list[str]]) -> tuple[set[str], set[str], set[str]]:
    """Return (paths, users, enabled units) the install's commands make."""
    paths: set[str] = set()
    users: set[str] = set()
    enabled: set[str] = set()
    for argv in install:
        if argv[0] == "useradd":
            users.add(argv[-1])
        elif argv[:3] == ["python3", "-m", "venv"]:
            paths.add(argv[3])
        elif argv[0] == "install":
            # Operands: what is neither an option nor the value of -m/-g/-o.
            *sources, dest = [a for before, a in pairwise(argv)
                              if a[0] != "-" and before not in ("-m", "-g", "-o")]
            if dest.endswith("/"):  # files into a folder: each under its own name
                for source in sources:
                    paths.update(dest + p.name for p in DEPLOY.glob(Path(source).name))
            else:
                paths.add(dest)
        elif argv[:3] == ["systemctl", "enable", "--now"]:
            enabled.update(argv[3:])
    return paths, users, enabled


def removed(path: str, uninstall: list[list[str]]) -> bool:
    gone = [a for argv in uninstall if argv[0] == "rm" for a in argv[1:] if a[0] != "-"]
    return any(fnmatch.fnmatch(path, g) or path.startswith(g.rstrip("/") + "/") for g in gone)


def test_the_uninstall_steps_undo_every_install_step() -> None:
    install, uninstall = commands(section("Install")), commands(section("Uninstall"))
    paths, users, enabled = made_by(install)
    assert {p for p in paths if p.startswith(UNIT_DIR)}, "the install's unit files were not read"
    assert [p for p in sorted(paths) if not removed(p, uninstall)] == []
    assert users and users <= {argv[-1] for argv in uninstall if argv[0] == "userdel"}
    # Every unit that can be enabled is disabled and stopped; the others (the batch, started
    # by the timer or by hand) stopped; the alert template ends by itself.
    disabled = {u for argv in uninstall if argv[:3] == ["systemctl", "disable", "--now"]
                for u in argv[3:]}
    stopped = {u for argv in uninstall if argv[:2] == ["systemctl", "stop"] for u in argv[2:]}
    installable = {p.name for p in DEPLOY.glob("nightdesk-*")
                   if p.suffix in (".service", ".timer") and "[Install]" in p.read_text()}
    assert enabled <= installable
    assert installable <= disabled, installable - disabled
    others = {p.name for p in DEPLOY.glob("nightdesk-*.service")
              if "@" not in p.name} - installable
    assert others <= stopped, others - stopped
    # The database the install's prose creates (`createdb -O nightdesk nightdesk`) is named.
    created = re.findall(r"createdb(?: -O \S+)? (\w+)", section("Install"))
    assert created and all(f"dropdb {db}" in section("Uninstall") for db in created)


def test_every_unit_the_install_copies_runs_what_its_pip_line_installed() -> None:
    # A unit whose ExecStart= is not in the venv fails `systemd-analyze verify` and, enabled,
    # fails at every start (status 203/EXEC). Steps run in order: a block's units may use
    # what its own or an earlier block's pip line installed.
    have: set[str] = set()
    copied = []
    for block in blocks(section("Install")):
        for argv in block:
            if argv[0].endswith("/pip") and argv[1] == "install":
                extras = re.search(r"\[([\w,]+)\]", argv[-1])
                have |= executables(set(extras.group(1).split(",")) if extras else set())
        for argv in block:
            if argv[0] == "install" and argv[-1] == UNIT_DIR:
                for name in (Path(a).name for a in argv[1:-1] if a[0] != "-"
                             and a not in ("0644", "0640")):
                    for unit in DEPLOY.glob(name):
                        copied.append(unit.name)
                        for program in re.findall(r"^ExecStart(?:Post)?=(\S+)",
                                                  unit.read_text(), re.MULTILINE):
                            if program.startswith(VENV_BIN):  # not logger(1)
                                assert program.removeprefix(VENV_BIN) in have, (
                                    unit.name, program, sorted(have))
    assert "nightdesk-batch.service" in copied


def test_the_install_makes_the_data_home_before_any_unit_starts() -> None:
    # `nd db upgrade` (SQLite) and `nd data ...` run before any unit: StateDirectory= would
    # make the folder only at a unit's first start, and the user may not make it in /var/lib.
    made = [argv for argv in commands(section("Install")) if argv[:2] == ["install", "-d"]
            and argv[-1] == STATE_DIR]
    assert made, f"no `install -d ... {STATE_DIR}` in the install steps"
    assert "-o" in made[0] and made[0][made[0].index("-o") + 1] == "nightdesk"


@pytest.mark.skipif(os.geteuid() != 0, reason="`nd` is defined in root's shell (runuser)")
def test_nd_runs_nightdesk_with_the_environment_file_as_the_units_do(tmp_path: Path) -> None:
    [nd] = re.findall(r"^nd\(\) \{.*\}$", section("Install"), re.MULTILINE)
    # This host's nightdesk, a copy of the file, root for the user: the rest as written.
    env = tmp_path / "nightdesk.env"
    env.write_text(f"NIGHTDESK_DATABASE_URL=sqlite:///{tmp_path}/nd.db\n"
                   "NIGHTDESK_SCHEDULE_CRON=10 0 * * *\n# NIGHTDESK_LOG_LEVEL=nonsense\n")
    nd = (nd.replace("/etc/nightdesk/nightdesk.env", str(env))
          .replace("/opt/nightdesk/venv/bin/nightdesk", str(Path(sys.executable).parent
                                                           / "nightdesk"))
          .replace("-u nightdesk", "-u root").replace("/var/lib/nightdesk", str(tmp_path)))
    result = subprocess.run(["bash", "-c", f"{nd}\nnd db upgrade"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "database schema created" in result.stdout
    assert (tmp_path / "nd.db").is_file()


def test_every_install_in_the_docs_makes_the_venv_the_units_run() -> None:
    # docs/operations.md's install from the wheel and deploy/'s units meet on one host: a
    # venv made elsewhere leaves every unit without its ExecStart= (status 203/EXEC).
    docs = [README, DEPLOY.parent / "docs" / "operations.md"]
    made = {(doc.name, argv[3]) for doc in docs for argv in commands(doc.read_text())
            if argv[:3] == ["python3", "-m", "venv"]}
    assert {doc for doc, _ in made} == {doc.name for doc in docs}, made
    assert {venv for _, venv in made} == {VENV_BIN.removesuffix("/bin/")}, made
