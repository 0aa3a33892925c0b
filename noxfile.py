"""Test sessions for lightning_bridge: ``./test`` runs them all (CI runs ``./test``), ``./test -l``
lists them, ``./test -s NAME`` runs one; arguments after ``--`` go to pytest.

torch and what every session has in common (the package's dependencies but lightning, the
``test`` and ``examples`` groups, tensorboard) are installed once, into ``.nox/_shared/``, which
each session reads through a ``.pth`` file: one install of about 1.4 GB instead of seven. A
session installs only its own packages (its lightning, determined, mypy, ruff) under
constraints that pin torch and its lightning. Servers the tests need (PostgreSQL) are started
by the tests' fixtures (tests/_servers.py), not here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
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
# Wall-clock limit for one example command; a hung example fails instead of stalling CI.
EXAMPLE_TIMEOUT_S = 600
# One pytest worker per core; a module's tests stay on one worker, so an expensive
# module-scoped run is made once. Modules are handed out in the order tests/conftest.py gives
# them (those starting the most processes first), not xdist's default of the most tests first,
# which left the long modules of a few tests each (Core API runs, kills, DDP) to the end, one
# worker training while the other idled.
XDIST = ["-n", "auto", "--dist", "loadscope", "--no-loadscope-reorder"]


def _extra(name: str) -> list[str]:
    """The requirements of one optional-dependency group of pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"][name])


def _shared_requirements() -> list[str]:
    """Every requirement of the package, its ``test`` and ``examples`` groups and tensorboard,
    torch pinned, lightning (each session fixes its version) left out."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        wanted = [*tomllib.load(f)["project"]["dependencies"], *_extra("test")]
    shared = set()
    for text in [*wanted, *_extra("examples"), "tensorboard"]:
        name = canonicalize_name(Requirement(text).name)
        if name == "torch":
            shared.add(f"torch=={TORCH}")
        elif name not in ("lightning", "pytorch-lightning"):
            shared.add(text)
    return sorted(shared)


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    """One install at a time: ``./test`` runs two lanes of sessions at once, which share the
    shared folder and build the package in its source tree (``*.egg-info``)."""
    SHARED.parent.mkdir(parents=True, exist_ok=True)
    with open(SHARED.parent / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _install(
    session: nox.Session, *packages: str, lightning: str = LATEST_LIGHTNING, editable: bool = True
) -> None:
    """`_install_unlocked`, one session at a time."""
    with _install_lock():
        _install_unlocked(session, *packages, lightning=lightning, editable=editable)


def _install_unlocked(session: nox.Session, *packages: str, lightning: str, editable: bool) -> None:
    """Install the session: the shared folder on its path, then `lightning` (a minor version)
    and `packages`, then the package itself (`editable`).

    The shared folder is named after what it holds, installed the first time and marked
    complete only when pip succeeded (any other folder there is removed). Its ``.pth`` line
    comes after the session's own site-packages, so pip sees the shared packages as installed,
    and a version the session's lightning needs instead goes into its own site-packages, which
    wins. Console scripts of the shared folder are not on PATH: run tools as ``python -m``.
    """
    requirements = _shared_requirements()
    digest = hashlib.sha256("\n".join([PYTHON, *requirements]).encode()).hexdigest()[:12]
    target = SHARED / f"py{PYTHON}-torch{TORCH}-{digest}"
    if not (target / ".complete").is_file():
        for old in SHARED.glob("*"):
            shutil.rmtree(old, ignore_errors=True)
        session.run(
            "python", "-m", "pip", "install", "--quiet", "--no-compile", "--target",
            str(target), *requirements,
        )  # fmt: skip
        (target / ".complete").write_text("\n".join(requirements) + "\n")
    purelib = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
    )
    (Path(str(purelib).strip()) / "_lightning_bridge_shared.pth").write_text(f"{target}\n")
    # lightning depends on the standalone pytorch_lightning, whose modules the adapter accepts
    # too: it must be the same release.
    constraints = Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text(
        f"torch=={TORCH}\nlightning=={lightning}.*\npytorch-lightning=={lightning}.*\n"
    )
    session.install("-c", str(constraints), f"lightning=={lightning}.*", *packages)
    if editable:
        session.install("-c", str(constraints), "-e", ".")
    versions = session.run(
        "python", "-c", "import importlib.metadata as m\n"
        "for n in ('torch', 'lightning', 'pytorch-lightning'): print(n, m.version(n))",
        silent=True,
    )  # fmt: skip
    session.log(f"installed: {' '.join(str(versions).split())}")
    for name, version in (line.split() for line in str(versions).splitlines() if line.strip()):
        want = TORCH if name == "torch" else f"{lightning}."
        if not version.split("+")[0].startswith(want):
            session.error(f"{name} {version} installed, {want}* expected")


def _env(session: nox.Session) -> dict[str, str]:
    """Keeps user-data writes (checkpoints in local mode) inside the session. The folder is
    absolute: `create_tmp()` names it relative to the nox process, and a relative
    XDG_DATA_HOME is ignored (the XDG specification), which sent the writes to ~/.local/share."""
    data_home = Path(session.create_tmp()).resolve() / "xdg-data"
    data_home.mkdir(parents=True, exist_ok=True)
    # The tests' processes write the bytecode of what they import (the package, the shared
    # folder's torch, installed without it), even where the machine sets
    # PYTHONDONTWRITEBYTECODE: else each of the hundreds of processes a session starts
    # compiles those modules again.
    return {"XDG_DATA_HOME": str(data_home), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": ""}


# Every session prints its slowest tests: CI's log is where the run's minutes are measured.
DURATIONS = "--durations=15"


def _pytest(session: nox.Session, *args: str) -> None:
    session.run(
        "python", "-m", "pytest", "-q", DURATIONS, *args, *session.posargs, env=_env(session)
    )


# Tests that have sessions of their own (their own installs or servers).
OWN_SESSIONS = (
    "not interop and not examples and not mlflow and not slurm and not ray and not transformers"
    " and not deepspeed and not transformers_legacy"
)


@nox.session(python=PYTHON)
@nox.parametrize("lightning", LIGHTNING_MINORS, ids=LIGHTNING_MINORS)
def tests(session: nox.Session, lightning: str) -> None:
    """Unit and integration tests against one lightning minor version.

    Against the latest: every test but those of the sessions below, the PostgreSQL ones
    included (their fixture starts the server). Against the older ones: the tests marked
    ``lightning_api`` (tests/conftest.py lists their modules: the fit on Fabric, the adapter,
    the port, DDP, AMP, resuming, Lightning's private names), what a Lightning release can
    change, but not the multi-process ones (``slow``: a minute or more each on two cores) nor
    the further cases of a test marked ``latest_lightning`` (the same Lightning code as the
    cases that do run: resuming from more checkpoints than one, a model compiled by inductor
    rather than the eager backend);
    the record, configs, searches and the runner's processes do not depend on it."""
    _install(session, *_extra("test"), lightning=lightning)
    marks = OWN_SESSIONS
    if lightning != LATEST_LIGHTNING:
        marks += (
            " and lightning_api and not slow and not latest_lightning and not search"
            " and not processes and not postgres"
        )
    _pytest(session, "-m", marks, "-rs", *XDIST)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and lint-imports (layers, no import cycle)."""
    with _install_lock():
        session.install(*_extra("lint"))
        # lint-imports reads the package's source; it needs it importable, not its dependencies.
        session.install("--no-deps", "-e", ".")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", "--diff", *LINT_PATHS)
    session.run("lint-imports")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy on the package."""
    _install(session, *_extra("typecheck"), editable=False)
    session.run("mypy", "lightning_bridge")


@nox.session(python=PYTHON)
def interop(session: nox.Session) -> None:
    """Tests marked ``interop``: lightning_bridge and determined==0.38.1 side by side (a module
    that maps determined onto the bridge puts Determined's own modules back when it ends, so
    modules share a worker in any order)."""
    # The [transformers] extra: DetCallback against Determined's own on one Trainer script.
    _install(session, *_extra("interop"), *_extra("test"), *_extra("transformers"))
    session.run("python", "-m", "pip", "check")
    _pytest(session, "-m", "interop", *XDIST)


# Examples another session runs, with the extra it installs: examples/deepspeed needs DeepSpeed
# (an sdist built with its ops disabled); the deepspeed session runs it in test mode
# (tests/test_deepspeed.py), against both DeepSpeed releases.
OWN_SESSION_EXAMPLES = {"deepspeed"}


def _example_commands(folder: Path, python: str) -> list[list[str]]:
    """What a user of the example runs, with the folder as working directory: every experiment
    config in test mode, and a Trainer-API ``train.py`` alone and under torchrun."""
    run = [python, "-m", "lightning_bridge", "run"]
    commands = [[*run, "const.yaml", "--test"]]
    for config in sorted(folder.glob("*.yaml")):
        if config.name != "const.yaml" and "entrypoint" in config.read_text(encoding="utf-8"):
            commands.append([*run, config.name, "--test"])
    if (folder / "train.py").is_file():
        commands.append([python, "train.py", "--test"])
        commands.append(
            [python, "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py", "--test"]
        )
    return commands


def _run_folder(folder: Path, commands: list[list[str]], env: dict[str, str]) -> list[str]:
    """An example folder's commands, one after the other (they may share files in the
    folder); what they printed, and a line per failure."""
    lines, failed = [], []
    for command in commands:
        shown = " ".join(Path(c).name if c == commands[0][0] else c for c in command)
        timeout = ["timeout", "--kill-after=30", str(EXAMPLE_TIMEOUT_S)]
        done = subprocess.run(
            [*timeout, *command],
            cwd=folder,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        lines.append(f"example {folder.name}: {shown} (exit {done.returncode})\n{done.stdout}")
        if done.returncode != 0:
            failed.append(f"{folder.name} ({shown})")
    return ["".join(lines), *failed]


@nox.session(python=PYTHON)
def examples(session: nox.Session) -> None:
    """Every example end to end in test mode.

    Each folder examples/<name>/ not starting with "_" or "." is an example with a const.yaml.
    Two folders run at a time (one per core); a folder's own commands run in order."""
    folders = sorted(
        p
        for p in (ROOT / "examples").iterdir()
        if p.is_dir() and not p.name.startswith(("_", ".")) and p.name not in OWN_SESSION_EXAMPLES
    )
    missing = [p.name for p in folders if not (p / "const.yaml").is_file()]
    if missing:
        session.error(
            f"examples/{', examples/'.join(missing)}: no const.yaml; prefix a folder that is "
            "not an example with '_'."
        )
    # hf_trainer trains with Hugging Face's Trainer: the [transformers] extra.
    _install(session, *_extra("transformers"))
    # The session's environment as `session.run` gives it: its bin first on PATH (the bridge
    # puts its interpreter's folder first on the PATH of a startup hook itself, so the ported
    # example's hook finds the session's python3 either way).
    env = {
        **_env(session),
        "PATH": os.pathsep.join([session.bin, os.environ.get("PATH", "")]),
        "VIRTUAL_ENV": os.path.dirname(session.bin),
    }
    python = os.path.join(session.bin, "python")
    # The folder with the most commands first, so that the two lanes end together.
    work = sorted(((f, _example_commands(f, python)) for f in folders), key=lambda w: -len(w[1]))
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for output, *failures in pool.map(lambda w: _run_folder(*w, env), work):
            print(output, flush=True)
            failed += failures
    if failed:
        session.error(f"examples failed: {', '.join(failed)}")


def _apt_install(session: nox.Session, package: str, command: str) -> None:
    """Debian's `package` (for `command`) with apt-get when missing and possible; the tests
    that need it skip, saying why, without it. Under the lock the test fixtures take for
    their own apt-get (tests/_servers.py), since two lanes of sessions run at once."""
    if shutil.which(command) or shutil.which("apt-get") is None or os.geteuid() != 0:
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=600"]
    steps = (
        ["apt-get", *wait, "update", "-qq"],
        ["apt-get", *wait, "install", "-y", "-qq", package],
    )
    with open(os.path.join(tempfile.gettempdir(), "lightning-bridge-apt.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for step in steps:
            try:
                session.run(*step, env=env, external=True)
            except nox.command.CommandFailed:
                session.log(f"{' '.join(step)} failed: the tests that need {command} will skip")
                return


# DeepSpeed releases the deepspeed session tests: the oldest supported (Determined's era) and
# the newest.
DEEPSPEED_RELEASES = ["0.16.9", "0.19.8"]


@nox.session(python=PYTHON)
@nox.parametrize("release", DEEPSPEED_RELEASES, ids=DEEPSPEED_RELEASES)
def deepspeed(session: nox.Session, release: str) -> None:
    """Tests marked ``deepspeed``: DeepSpeedTrial on DeepSpeed's own engine, on the CPU with
    gloo (``DS_ACCELERATOR=cpu``), against one DeepSpeed release. DeepSpeed is an sdist; it
    builds with its ops disabled (``DS_BUILD_OPS=0``) and none is compiled at run time: the
    trials use torch's Adam (``torch_adam``) and the bridge keeps DeepSpeed from compiling its
    CPU shared-memory all-reduce kernel (docs/deepspeed.md). Should one be compiled after all,
    it goes into the session's own folder, not ``~/.cache/torch_extensions``, where two
    releases' builds of an op would share a name."""
    extensions = Path(session.create_tmp()).resolve() / "torch_extensions"
    session.env.update(
        {"DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(extensions)}
    )
    # Determined's own DeepSpeedTrial runner, the parity reference, beside its era's DeepSpeed.
    reference = ["determined==0.38.1"] if release == DEEPSPEED_RELEASES[0] else []
    _install(session, *_extra("test"), f"deepspeed=={release}", *reference)
    _pytest(session, "-rs", "-m", "deepspeed", "-n", "0")


@nox.session(python=PYTHON)
def mlflow(session: nox.Session) -> None:
    """Tests marked ``mlflow``: the record mirrored into a real ``mlflow server`` the tests
    start (tests/_mlflow_server.py), the model registry, a server stopped mid-run, and MLflow's
    UI in headless Chromium (screenshots kept in ``.nox/mlflow-artifacts``). The client is the
    ``[mlflow]`` extra (mlflow-skinny); the full ``mlflow[auth]`` is installed for its server,
    its basic-auth app and its UI. The ``[transformers]`` extra too, for a Hugging Face Trainer
    run mirrored into the server: about 170 MB and two minutes of install, less than the full
    MLflow (about 360 MB) would add to the transformers session."""
    _apt_install(session, "chromium", "chromium")
    _install(session, *_extra("test"), *_extra("mlflow"), "mlflow[auth]", *_extra("transformers"))
    artifacts = ROOT / ".nox" / "mlflow-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    env = {**_env(session), "LIGHTNING_BRIDGE_TEST_ARTIFACTS": str(artifacts)}
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        DURATIONS,
        "-rs",
        "-m",
        "mlflow",
        "-n",
        "0",
        *session.posargs,
        env=env,
    )


@nox.session(python=PYTHON)
def slurm(session: nox.Session) -> None:
    """Tests marked ``slurm``, against a two-node Slurm cluster the tests start on this machine
    (tests/_slurm_cluster.py: Debian's ``slurm-wlm`` and ``munge``, installed with apt-get when
    missing, run as root); skipped, with the reason, where Slurm cannot start."""
    _install(session, *_extra("test"))
    # Two workers share the one cluster (its fixture starts it once): the tests mostly wait.
    _pytest(session, "-m", "slurm", "-rs", "-n", "2", "--dist", "worksteal")


@nox.session(python=PYTHON)
def ray(session: nox.Session) -> None:
    """Tests marked ``ray``, against a two-node Ray cluster the tests start on this machine
    (tests/_ray_cluster.py: ``ray start --head`` and a second ``ray start --address``, both on
    127.0.0.1 with their own ports and temporary folders, stopped by the fixture). Ray is the
    ``[ray]`` extra (``ray[default]``)."""
    _install(session, *_extra("test"), *_extra("ray"))
    env = {**_env(session), "LIGHTNING_BRIDGE_RAY_REQUIRED": "1"}  # no cluster: a failure
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        DURATIONS,
        "-m",
        "ray",
        "-rs",
        "-n",
        "0",
        *session.posargs,
        env=env,
    )


# Determined's hf_trainer_api examples (transformers 4.28's era): transformers before 4.46
# (`is_torch_tpu_available`, `--evaluation_strategy`), datasets before 3 (`use_auth_token`)
# and evaluate, each pinned to a release that installs beside torch 2.13 and numpy 2.
TRANSFORMERS_LEGACY = ["transformers==4.45.2", "datasets==2.21.0", "evaluate==0.4.6"]


@nox.session(python=PYTHON)
def transformers_legacy(session: nox.Session) -> None:
    """Tests marked ``transformers_legacy``: Determined's own
    ``hf_trainer_api/hf_language_modeling`` example run unchanged (const, adaptive, two
    processes) with local stand-ins for the Hub's gpt2, wikitext and accuracy metric. About
    270 MB beyond the transformers session's packages (datasets' pyarrow and pandas)."""
    _install(session, *_extra("test"), *_extra("transformers"), *TRANSFORMERS_LEGACY)
    _pytest(session, "-m", "transformers_legacy", "-rs", "-n", "0")


@nox.session(python=PYTHON)
def transformers(session: nox.Session) -> None:
    """Tests marked ``transformers``: Hugging Face's Trainer with ``determined.transformers``'
    DetCallback under ``lightning-bridge run`` (tiny GPT-2 models built from a config, no
    download). transformers and accelerate are the ``[transformers]`` extra. The module's runs
    are spread over the workers one test at a time (each is a few trial processes).

    DeepSpeed through the Trainer (``--deepspeed``, tests/test_transformers_deepspeed.py):
    the newest DeepSpeed release the deepspeed session tests, built from its sdist with its
    ops disabled as there, on the CPU accelerator (about 25 MB and under three minutes of
    install, where the deepspeed session would add transformers' 170 MB once per release)."""
    session.env.update({"DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cpu"})
    _install(
        session, *_extra("test"), *_extra("transformers"), f"deepspeed=={DEEPSPEED_RELEASES[-1]}"
    )
    _pytest(session, "-m", "transformers", "-rs", "-n", "auto", "--dist", "load")
