"""Test sessions for lightning_bridge.

``./test`` runs every session below (it is the project's test command and what CI runs);
``./test -s NAME`` runs one, ``./test -l`` lists them. Arguments after ``--`` go to pytest.

torch and the packages every session has in common (the package's dependencies other than
lightning, the test tools, the storage and search back ends, the examples' extras) are
installed once, into ``.nox/_shared/``, and every session's virtual environment reads them
through a ``.pth`` file: the sessions cost one install of them (about 1.4 GB) instead of
seven. A session installs only what is its own (its lightning, determined, mypy, ruff) under a
constraints file that pins torch (and lightning where the session fixes its version), so no
later install can swap either of them out. Virtual environments are reused between runs
(``nox -R`` skips the installs entirely). Tool versions (pytest, ruff, mypy, import-linter,
determined, the examples' extras) come from the optional-dependency groups in pyproject.toml,
so ``pip install -e .[dev]`` gives a developer the same tools. pytest keeps the temporary
folders of failed tests only (``tmp_path_retention_policy`` in pyproject.toml).

Sessions:

- ``tests``: the unit and integration tests against each supported lightning minor version
  (markers ``interop`` and ``examples`` are left to their own sessions).
- ``lint``: ruff check, ruff format --check, and lint-imports (the layers of the package and
  no import cycle between its modules, as configured in pyproject.toml).
- ``typecheck``: mypy on the package (configured in pyproject.toml).
- ``interop``: the tests marked ``interop``, with determined==0.38.1 in the same venv.
- ``examples``: every example end to end in test mode.
- ``postgres``: the tests marked ``postgres`` against a PostgreSQL server the session starts on
  127.0.0.1 (Debian's ``postgresql`` package, installed with apt-get when missing); skipped,
  with the reason, when no server can be started.

The end-to-end search tests (marker ``search``: trials as subprocesses) and the runner's
process tests (marker ``processes``: signals, kills, scripts as subprocesses) run in the tests
session of the latest lightning only: they exercise the runner's and the search's processes,
not Lightning, whose side (validations at the rungs, the searcher's stop, the stop at an agreed
batch, DDP) every tests session checks in process or with two ranks.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path

import nox
import nox.command
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

nox.needs_version = ">=2024.4.15"
nox.options.error_on_missing_interpreters = True
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).resolve().parent
SHARED = ROOT / ".nox" / "_shared"
PYTHON = "3.11"
TORCH = "2.13.0"
LIGHTNING_MINORS = ["2.4", "2.5", "2.6"]
LATEST_LIGHTNING = LIGHTNING_MINORS[-1]
LINT_PATHS = ["lightning_bridge", "tests", "examples", "bench", "noxfile.py"]
# Wall-clock limit for one example in test mode; a hung example fails instead of stalling CI.
EXAMPLE_TIMEOUT_S = 600


def _extra(name: str) -> list[str]:
    """The requirements of one optional-dependency group of pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return list(project["optional-dependencies"][name])


# Requirements no session fixes the version of: torch (pinned), the project's dependencies
# other than lightning, and the tools and back ends the tests and examples use. They are
# installed once into a shared folder (see _install_shared).
_PER_SESSION = {"lightning", "pytorch-lightning"}


def _shared_requirements() -> list[str]:
    """What goes into the shared folder: every requirement of the package, its ``test`` and
    ``examples`` groups and tensorboard, except lightning (each session fixes its version)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = [*project["dependencies"], *_extra("test"), *_extra("examples"), "tensorboard"]
    shared = set()
    for text in wanted:
        name = canonicalize_name(Requirement(text).name)
        if name == "torch":
            shared.add(f"torch=={TORCH}")
        elif name not in _PER_SESSION:
            shared.add(text)
    return sorted(shared)


def _install_shared(session: nox.Session, lightning: str | None = None) -> str:
    """Make the shared install importable in the session; return a constraints file that keeps
    torch (and lightning) pinned.

    torch and the requirements every session has in common (_shared_requirements) are
    installed once into a folder under ``.nox/_shared`` named after what it holds (installed
    the first time, marked complete only when pip succeeded; any other folder there is
    removed). A ``.pth`` file puts it on the session's ``sys.path`` after the session's own
    site-packages, so pip sees those packages as installed: a session's install adds only what
    is missing (lightning, the session's tools) and, where the session's lightning needs
    another version of a shared package, installs that version into the session's own
    site-packages, which comes first. The constraints keep any install from fetching another
    torch build. Console scripts of the shared folder are not on the session's PATH: run the
    tools as ``python -m``.
    """
    requirements = _shared_requirements()
    digest = hashlib.sha256("\n".join([PYTHON, *requirements]).encode()).hexdigest()[:12]
    target = SHARED / f"py{PYTHON}-torch{TORCH}-{digest}"
    if not (target / ".complete").is_file():
        for old in SHARED.glob("*") if SHARED.is_dir() else []:
            shutil.rmtree(old, ignore_errors=True)
        session.run(
            "python", "-m", "pip", "install", "--quiet", "--no-compile", "--target",
            str(target), *requirements,
        )  # fmt: skip
        (target / ".complete").write_text("\n".join(requirements) + "\n")
    purelib = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
    )
    site = Path(str(purelib).strip())
    for stale in site.glob("_lightning_bridge_shared*.pth"):
        stale.unlink()
    (site / "_lightning_bridge_shared.pth").write_text(f"{target}\n")
    constraints = Path(session.create_tmp()) / "constraints.txt"
    lines = [f"torch=={TORCH}"]
    if lightning is not None:
        # lightning depends on the standalone pytorch_lightning package, whose modules the
        # adapter accepts too: it must be the same release as the session's lightning.
        lines.append(f"lightning=={lightning}.*")
        lines.append(f"pytorch-lightning=={lightning}.*")
    constraints.write_text("\n".join(lines) + "\n")
    return str(constraints)


def _check_versions(session: nox.Session, lightning: str | None = None) -> None:
    """Fail at once if an install replaced torch or lightning (or pytorch-lightning, which
    must match it); log what is installed."""
    out = session.run(
        "python",
        "-c",
        "import importlib.metadata as m\n"
        "for name in ('torch', 'lightning', 'pytorch-lightning'):\n"
        "    try: print(name, m.version(name))\n"
        "    except m.PackageNotFoundError: print(name, '-')",
        silent=True,
    )
    versions = dict(line.split() for line in str(out).splitlines() if line.strip())
    session.log("installed: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if versions.get("torch", "-").split("+")[0] != TORCH:
        session.error(f"torch {versions.get('torch')} installed, torch=={TORCH} expected")
    for name in ("lightning", "pytorch-lightning"):
        if lightning is not None and not versions.get(name, "-").startswith(lightning + "."):
            session.error(f"{name} {versions.get(name)} installed, {lightning}.* expected")


def _data_home(session: nox.Session) -> dict[str, str]:
    """Environment that keeps user-data writes (checkpoints in local mode) inside the session."""
    data_home = Path(session.create_tmp()) / "xdg-data"
    data_home.mkdir(parents=True, exist_ok=True)
    return {"XDG_DATA_HOME": str(data_home), "MPLBACKEND": "Agg"}


def _test_files() -> list[Path]:
    tests = ROOT / "tests"
    if not tests.is_dir():
        return []
    return sorted({*tests.rglob("test_*.py"), *tests.rglob("*_test.py")})


# One pytest worker per core; a module's tests stay on one worker, so an expensive
# module-scoped run is made once.
# (Not the interop session: its tests map `determined` onto the bridge or load the real one
# in the same process, so they run in one worker, in file order.)
XDIST = ["-n", "auto", "--dist", "loadscope"]


def _pytest(
    session: nox.Session, args: Iterable[str], env: dict[str, str], allow_empty: str | None
) -> None:
    """Run pytest; ``allow_empty`` (a reason) lets exit code 5, "no tests collected", pass."""
    success = [0]
    if allow_empty is not None:
        session.log(f"{allow_empty}: pytest's exit code 5 (no tests collected) counts as success")
        success.append(5)
    session.run("python", "-m", "pytest", *args, *session.posargs, env=env, success_codes=success)


def _tests(session: nox.Session, lightning: str) -> None:
    """Unit and integration tests against one lightning minor version."""
    constraints = _install_shared(session, lightning)
    session.install("-c", constraints, f"lightning=={lightning}.*", "torchmetrics", *_extra("test"))
    session.install("-c", constraints, "-e", ".")
    _check_versions(session, lightning)
    if not (ROOT / "tests").is_dir():
        session.log("no tests/ folder yet: nothing to run")
        return
    # Exit code 5 is accepted only while the repository has no test file at all.
    allow_empty = None if _test_files() else "no test files under tests/ yet"
    marks = "not interop and not examples and not postgres"
    if lightning != LATEST_LIGHTNING:
        marks += " and not search and not processes"
    _pytest(session, ["-m", marks, "-q", *XDIST], _data_home(session), allow_empty)


def _register_tests(lightning: str) -> None:
    """The session `tests-<minor>` (e.g. `./test -s tests-2.6`)."""

    def tests(session: nox.Session) -> None:
        _tests(session, lightning)

    tests.__doc__ = f"Unit and integration tests against lightning {lightning}."
    nox.session(python=PYTHON, name=f"tests-{lightning}")(tests)


for _minor in LIGHTNING_MINORS:
    _register_tests(_minor)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and lint-imports."""
    session.install(*_extra("lint"))
    # lint-imports reads the package's source; it needs it importable, not its dependencies.
    session.install("--no-deps", "-e", ".")
    paths = [p for p in LINT_PATHS if (ROOT / p).exists()]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", "--diff", *paths)
    session.run("lint-imports")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy on the package, with torch, lightning, torchmetrics, numpy and optuna installed for
    types."""
    if not any((ROOT / "lightning_bridge").rglob("*.py")):
        session.log("no Python files in lightning_bridge/ yet: nothing to type-check")
        return
    constraints = _install_shared(session, LATEST_LIGHTNING)
    session.install(
        "-c",
        constraints,
        f"lightning=={LATEST_LIGHTNING}.*",
        "torchmetrics",
        "numpy",
        *_extra("typecheck"),
        *_extra("search"),
    )
    _check_versions(session, LATEST_LIGHTNING)
    session.run("mypy", "lightning_bridge")


@nox.session(python=PYTHON)
def interop(session: nox.Session) -> None:
    """Tests marked ``interop``: lightning_bridge and determined==0.38.1 side by side."""
    constraints = _install_shared(session, LATEST_LIGHTNING)
    session.install(
        "-c",
        constraints,
        *_extra("interop"),
        f"lightning=={LATEST_LIGHTNING}.*",
        "torchmetrics",
        *_extra("test"),
    )
    session.install("-c", constraints, "-e", ".")
    session.run("python", "-m", "pip", "check")
    _check_versions(session, LATEST_LIGHTNING)
    if not (ROOT / "tests").is_dir():
        session.log("no tests/ folder yet: nothing to run")
        return
    # Exit code 5 is accepted only while no test file mentions the interop marker.
    mentioned = any("interop" in p.read_text(encoding="utf-8") for p in _test_files())
    if not mentioned:
        conftests = (ROOT / "tests").rglob("conftest.py")
        mentioned = any("interop" in p.read_text(encoding="utf-8") for p in conftests)
    allow_empty = None if mentioned else "no test file uses the interop marker yet"
    _pytest(session, ["-m", "interop", "-q"], _data_home(session), allow_empty)


# Examples convention: each example is a folder examples/<name>/ holding a const.yaml (the
# experiment config a Determined user submits) and a README.md. This session runs, with the
# folder as working directory:
#   lightning-bridge run const.yaml --test        (every example)
#   lightning-bridge run OTHER.yaml --test        (each other experiment config of the folder)
#   python train.py --test                        (where a Trainer-API train.py exists)
#   torchrun --nproc_per_node=2 train.py --test   (the same script under torchrun)
# and fails if any of them fails. A folder whose name starts with "_" or "." is not an example
# (shared data, helpers); any other folder without a const.yaml is an error.
def _example_commands(folder: Path, python: str) -> list[list[str]]:
    commands = [[python, "-m", "lightning_bridge", "run", "const.yaml", "--test"]]
    # Every other experiment config of the folder too (a search trains its first trial).
    for config in sorted(folder.glob("*.yaml")):
        if config.name != "const.yaml" and "entrypoint" in config.read_text(encoding="utf-8"):
            commands.append([python, "-m", "lightning_bridge", "run", config.name, "--test"])
    if (folder / "train.py").is_file():
        commands.append([python, "train.py", "--test"])
        commands.append(
            [python, "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py", "--test"]
        )
    return commands


@nox.session(python=PYTHON)
def examples(session: nox.Session) -> None:
    """Every example end to end in test mode."""
    examples_dir = ROOT / "examples"
    folders = sorted(
        p
        for p in (examples_dir.iterdir() if examples_dir.is_dir() else [])
        if p.is_dir() and not p.name.startswith(("_", "."))
    )
    if not folders:
        session.log("no examples found: no folder examples/<name>/ with a const.yaml yet")
        return
    missing = [p.name for p in folders if not (p / "const.yaml").is_file()]
    if missing:
        session.error(
            f"examples/{', examples/'.join(missing)}: no const.yaml. Every folder under "
            "examples/ is an example with an experiment config; prefix a folder that is not an "
            "example with '_'."
        )

    constraints = _install_shared(session, LATEST_LIGHTNING)
    session.install(
        "-c",
        constraints,
        f"lightning=={LATEST_LIGHTNING}.*",
        "torchmetrics",
        "tensorboard",
        *_extra("examples"),
    )
    session.install("-c", constraints, "-e", ".")
    _check_versions(session, LATEST_LIGHTNING)

    env = _data_home(session)
    python = os.path.join(session.bin, "python")
    failed = []
    for folder in folders:
        for command in _example_commands(folder, python):
            shown = " ".join(Path(c).name if c == python else c for c in command)
            session.log(f"example {folder.name}: {shown}")
            with session.chdir(folder):
                try:
                    session.run(
                        "timeout",
                        "--kill-after=30",
                        str(EXAMPLE_TIMEOUT_S),
                        *command,
                        env=env,
                        external=True,
                    )
                except nox.command.CommandFailed:
                    failed.append(f"{folder.name} ({shown})")
    session.log(f"examples: {len(failed)} command(s) failed")
    if failed:
        session.error(f"examples failed: {', '.join(failed)}")


# The PostgreSQL server of the postgres session: Debian's binaries, a data directory of its
# own, the loopback address, a free port. PostgreSQL refuses to run as root, so as root the
# server runs as a dedicated system user.
POSTGRES_USER = "lightning-bridge-pg"


def _postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian's layout), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parent)
    return found[-1].parent if found else None


def _install_postgres(session: nox.Session) -> str | None:
    """Install Debian's postgresql with apt-get when it is missing; a reason when it cannot."""
    if _postgres_bin() is not None:
        return None
    if shutil.which("apt-get") is None:
        return "PostgreSQL is not installed and there is no apt-get to install it"
    if os.geteuid() != 0:
        return "PostgreSQL is not installed and installing it with apt-get needs root"
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "postgresql"],
    ):
        try:
            session.run(*command, env=env, external=True)
        except nox.command.CommandFailed:
            return f"{' '.join(command)} failed"
    return None if _postgres_bin() is not None else "apt-get installed no PostgreSQL server"


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", POSTGRES_USER, "--", *command]


def _start_postgres(session: nox.Session, folder: Path) -> tuple[str | None, str]:
    """Start a server with its data in `folder`; (its URL, "") or (None, why not)."""
    reason = _install_postgres(session)
    binaries = _postgres_bin()
    if reason is not None or binaries is None:
        return None, reason or "no PostgreSQL server binaries"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(POSTGRES_USER)
        except KeyError:
            session.run(
                "useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                POSTGRES_USER, external=True,
            )  # fmt: skip
        shutil.chown(folder, user=POSTGRES_USER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = folder / "data"
    steps = [
        [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        [
            str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w",
            "-o", f"-h 127.0.0.1 -p {port} -k {folder}", "start",
        ],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(_as_server_user(step), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None, f"{Path(step[0]).name} failed: {(done.stderr or done.stdout).strip()}"
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", ""


@nox.session(python=PYTHON)
def postgres(session: nox.Session) -> None:
    """The tests marked ``postgres``, against a PostgreSQL server started for the session."""
    folder = Path(tempfile.mkdtemp(prefix="lightning-bridge-pg-"))
    folder.chmod(0o755)
    url, reason = _start_postgres(session, folder)
    if url is None:
        shutil.rmtree(folder, ignore_errors=True)
        session.skip(f"no PostgreSQL server could be started: {reason}")
    try:
        constraints = _install_shared(session, LATEST_LIGHTNING)
        session.install(
            "-c", constraints, f"lightning=={LATEST_LIGHTNING}.*", "torchmetrics", *_extra("test")
        )
        session.install("-c", constraints, "-e", ".")
        _check_versions(session, LATEST_LIGHTNING)
        session.log(f"PostgreSQL server at {url}")
        env = {**_data_home(session), "LIGHTNING_BRIDGE_TEST_POSTGRES": url}
        _pytest(session, ["-m", "postgres", "-q", "-rs"], env, None)
    finally:
        binaries = _postgres_bin()
        if binaries is not None:
            stop = [str(binaries / "pg_ctl"), "-D", str(folder / "data"), "-m", "fast", "stop"]
            subprocess.run(_as_server_user(stop), capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


@nox.session(python=PYTHON)
def slurm(session: nox.Session) -> None:
    """The tests marked ``slurm``, against a two-node Slurm cluster the tests start on this
    machine (tests/_slurm_cluster.py: Debian's ``slurm-wlm`` and ``munge``, installed with
    apt-get when missing and run as root); skipped, with the reason, where Slurm cannot
    start."""
    constraints = _install_shared(session, LATEST_LIGHTNING)
    session.install(
        "-c", constraints, f"lightning=={LATEST_LIGHTNING}.*", "torchmetrics", *_extra("test")
    )
    session.install("-c", constraints, "-e", ".")
    _check_versions(session, LATEST_LIGHTNING)
    _pytest(session, ["-m", "slurm", "-q", "-rs"], _data_home(session), None)
