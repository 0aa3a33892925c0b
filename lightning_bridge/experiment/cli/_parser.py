"""The `lightning-bridge` command line: its subcommands and options (argparse).

Each subcommand names its handler (`handler`, a key `_main` resolves), so the parser stays a
description of the command line and imports nothing of what the commands run.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

from lightning_bridge._version import __version__
from lightning_bridge.experiment.launch import LAUNCHERS


def _devices(text: str) -> Any:
    """`--devices`: a process count, or a value Lightning reads itself ("auto", "0,1")."""
    if text.strip().lstrip("-").isdigit():
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
        return value
    return text


def _workspace_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--workspace",
        type=pathlib.Path,
        default=None,
        metavar="DIR",
        help="the workspace folder holding the experiment record (default: "
        "$LIGHTNING_BRIDGE_WORKSPACE, else lightning-bridge in the user's data directory)",
    )
    return common


def _add_run(commands: Any, common: argparse.ArgumentParser) -> None:
    run = commands.add_parser(
        "run",
        parents=[common],
        help="run a Determined experiment folder (const.yaml + trial code)",
        description="Run the experiment CONFIG describes, with the code in CONTEXT_DIR, on "
        "Lightning: what `det e create CONFIG CONTEXT_DIR` would run on a cluster. Each run is "
        "a new experiment in the workspace.",
    )
    run.add_argument("config", metavar="CONFIG", help="the experiment config (YAML)")
    run.add_argument(
        "context_dir",
        metavar="CONTEXT_DIR",
        nargs="?",
        default=None,
        help="the folder holding the trial code (default: the config's folder)",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value (YAML), e.g. --set hyperparameters.lr=0.01; repeatable",
    )
    run.add_argument(
        "--test", action="store_true", help="test mode: one training and one validation batch"
    )
    run.add_argument(
        "--resume",
        metavar="CKPT",
        default=None,
        help="start from a checkpoint: its directory, its id (any storage), or 'latest' (the "
        "newest checkpoint of an earlier run of CONFIG)",
    )
    run.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load checkpoints with full unpickling (objects outside the weights-only safe "
        "set); only for files you trust: unpickling can run code",
    )
    run.add_argument(
        "--devices",
        type=_devices,
        default=None,
        help="processes / devices (default: resources.slots_per_trial)",
    )
    run.add_argument(
        "--accelerator", default=None, help="Lightning accelerator: cpu, gpu, auto, ..."
    )
    run.add_argument(
        "--precision", default=None, help="Lightning precision: 32-true, bf16-mixed, 16-mixed"
    )
    run.add_argument("--strategy", default=None, help="Lightning strategy: ddp, fsdp, ...")
    run.add_argument(
        "--force",
        action="store_true",
        help="run more processes than CPU cores (oversubscribed) without asking",
    )
    _launcher_option(run, "the workspace's launcher setting (workspace.json), else local")
    _worker_jobs_option(run, "one job per trial")
    _search_options(run)
    _tracking_option(run)
    run.set_defaults(handler="run")


def _tracking_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tracking-uri",
        default=None,
        metavar="URI",
        help="the MLflow tracking server the record is mirrored to (default: "
        "$MLFLOW_TRACKING_URI, else the workspace's mlflow.json setting, else MLflow's SQLite "
        "store in the workspace when MLflow is installed; 'off': no mirror)",
    )


def _launcher_option(parser: argparse.ArgumentParser, default: str) -> None:
    """`--launcher`; `default` says what applies when it is left out (nothing is filled in:
    a run looks up the workspace's setting, a continue the experiment's own)."""
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=None,
        help="where trials run: local (processes on this machine), slurm (one sbatch job "
        "per trial) or ray (placed on a Ray cluster: Kubernetes through KubeRay, cloud VMs, "
        f"on-prem nodes); docs/cluster.md; default: {default}",
    )
    parser.add_argument(
        "--address",
        default=None,
        metavar="ADDRESS",
        help="with --launcher ray, the Ray cluster: HOST:PORT of its head (GCS), "
        "ray://HOST:10001 through Ray Client, or auto (default: $RAY_ADDRESS, else the "
        "experiment's own, else auto)",
    )


def _worker_jobs_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--worker-jobs",
        type=int,
        default=None,
        metavar="N",
        help="with --launcher slurm, run a search's trials in N long-running Slurm jobs, each "
        "sized for one trial and starting its trials from a warm process (about a second "
        f"each) instead of a new job per trial (docs/cluster.md); default: {default}",
    )


def _search_options(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument(
        "--storage",
        required=required,
        default=None,
        metavar="URL",
        help="where a hyperparameter search keeps its state: a journal file path, "
        "sqlite:///FILE or postgresql://USER@HOST/DB (workers on several machines); default: "
        "a journal file in the experiment's folder",
    )
    parser.add_argument(
        "--lost-after",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a search's running trial not heard of for this long is taken as lost with its "
        "worker and given to another (default 300)",
    )


def _add_search_worker(commands: Any, common: argparse.ArgumentParser) -> None:
    worker = commands.add_parser(
        "search-worker",
        parents=[common],
        help="train trials of a search started elsewhere (another machine's worker)",
        description="Pull trials from the hyperparameter search NAME in the shared --storage "
        "and train them on this machine, recording them in this machine's workspace, until the "
        "search is finished. `lightning-bridge run` prints NAME when it starts a search.",
    )
    worker.add_argument("experiment", metavar="NAME", help="the search's name in the storage")
    _search_options(worker, required=True)
    worker.add_argument(
        "--context-dir",
        type=pathlib.Path,
        default=None,
        metavar="DIR",
        help="the trial code's folder on this machine (default: the folder the search was "
        "started from, which must then exist here too)",
    )
    _launcher_option(
        worker, "the search's own, the one it was started with (not this workspace's setting)"
    )
    worker.set_defaults(handler="search-worker")


def _add_record_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    parents = [common, output]

    experiment = commands.add_parser("experiment", aliases=["e"], help="the recorded experiments")
    verbs = experiment.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", parents=parents, help="list the experiments")
    listing.set_defaults(handler="record:experiment_list")
    describe = verbs.add_parser(
        "describe", parents=parents, help="an experiment's trials, metrics and checkpoints"
    )
    describe.add_argument("id", type=int, metavar="ID")
    describe.set_defaults(handler="record:experiment_describe")
    cont = verbs.add_parser(
        "continue",
        parents=[common],
        help="continue each unfinished trial from its latest checkpoint",
    )
    cont.add_argument("id", type=int, metavar="ID")
    cont.add_argument(
        "--lost-after",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a search's trial not heard of for this long is given to another worker",
    )
    _launcher_option(cont, "the experiment's own")
    _worker_jobs_option(cont, "the experiment's own")
    cont.set_defaults(handler="continue")
    plot = verbs.add_parser(
        "plot", parents=parents, help="write a PNG of each trial's training and validation curves"
    )
    plot.add_argument("id", type=int, metavar="ID")
    plot.add_argument(
        "--out", type=pathlib.Path, default=None, metavar="FILE",
        help="the PNG to write (default: experiment-ID.png)",
    )  # fmt: skip
    plot.set_defaults(handler="record:experiment_plot")
    sync = verbs.add_parser(
        "sync",
        parents=parents,
        help="send what MLflow lacks of an experiment's record (idempotent)",
    )
    sync.add_argument("id", type=int, metavar="ID")
    _tracking_option(sync)
    sync.set_defaults(handler="model:experiment_sync")
    pause = verbs.add_parser(
        "pause",
        parents=parents,
        help="every running trial checkpoints and stops (continue resumes)",
    )
    pause.add_argument("id", type=int, metavar="ID")
    pause.set_defaults(handler="record:experiment_pause")
    kill = verbs.add_parser(
        "kill", parents=parents, help="end every running trial now (its Slurm job is cancelled)"
    )
    kill.add_argument("id", type=int, metavar="ID")
    kill.set_defaults(handler="record:experiment_kill")

    trial = commands.add_parser("trial", aliases=["t"], help="the recorded trials")
    trial_verbs = trial.add_subparsers(dest="verb", required=True, metavar="VERB")
    logs = trial_verbs.add_parser("logs", parents=parents, help="print a trial's log")
    logs.add_argument("id", type=int, metavar="ID")
    logs.add_argument("--tail", type=int, default=None, metavar="N", help="the last N lines")
    logs.set_defaults(handler="record:trial_logs")

    checkpoint = commands.add_parser("checkpoint", aliases=["c"], help="the kept checkpoints")
    ckpt_verbs = checkpoint.add_subparsers(dest="verb", required=True, metavar="VERB")
    ckpt_list = ckpt_verbs.add_parser("list", parents=parents, help="list checkpoints")
    ckpt_list.add_argument("--experiment", type=int, default=None, metavar="ID")
    ckpt_list.add_argument("--trial", type=int, default=None, metavar="ID")
    ckpt_list.add_argument(
        "--best", type=int, nargs="?", const=1, default=None, metavar="N",
        help="only each experiment's N best by its searcher metric (default 1)",
    )  # fmt: skip
    ckpt_list.set_defaults(handler="record:checkpoint_list")
    download = ckpt_verbs.add_parser(
        "download", parents=parents, help="copy a checkpoint from its storage to a folder"
    )
    download.add_argument(
        "uuid", metavar="UUID", help="a checkpoint's uuid, or models:/NAME/VERSION or "
        "models:/NAME@ALIAS (a registered model version)",
    )  # fmt: skip
    _tracking_option(download)
    download.add_argument("--out", required=True, type=pathlib.Path, metavar="DIR")
    download.set_defaults(handler="record:checkpoint_download")


def _add_model_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    _tracking_option(output)
    parents = [common, output]
    model = commands.add_parser(
        "model", aliases=["m"], help="the model registry (MLflow's), as `det model`"
    )
    verbs = model.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = verbs.add_parser("create", parents=parents, help="create a registered model")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--description", default="", metavar="TEXT")
    create.set_defaults(handler="model:model_create")
    register = verbs.add_parser(
        "register-version",
        parents=parents,
        help="register a checkpoint (uuid, folder or storage URI) as the model's next version",
    )
    register.add_argument("name", metavar="NAME")
    register.add_argument("checkpoint", metavar="CHECKPOINT_UUID|DIR|URI")
    register.add_argument(
        "--alias", action="append", default=[], metavar="ALIAS",
        help="give the new version this alias (e.g. champion); repeatable",
    )  # fmt: skip
    register.add_argument("--description", default="", metavar="TEXT")
    register.set_defaults(handler="model:model_register_version")
    listing = verbs.add_parser("list", parents=parents, help="list the registered models")
    listing.set_defaults(handler="model:model_list")
    versions = verbs.add_parser("list-versions", parents=parents, help="a model's versions")
    versions.add_argument("name", metavar="NAME")
    versions.set_defaults(handler="model:model_list_versions")
    describe = verbs.add_parser("describe", parents=parents, help="a model and its versions")
    describe.add_argument("name", metavar="NAME")
    describe.set_defaults(handler="model:model_describe")
    alias = verbs.add_parser("alias", parents=parents, help="point ALIAS at a model's VERSION")
    alias.add_argument("name", metavar="NAME")
    alias.add_argument("alias", metavar="ALIAS")
    alias.add_argument("version", metavar="VERSION")
    alias.set_defaults(handler="model:model_alias")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-bridge",
        description="Run Determined trials on PyTorch Lightning, and keep a record of every "
        "run: experiments, trials, metrics and checkpoints.",
    )
    parser.add_argument("--version", action="version", version=f"lightning-bridge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _workspace_options()
    _add_run(commands, common)
    _add_search_worker(commands, common)
    _add_record_commands(commands, common)
    _add_model_commands(commands, common)

    port = commands.add_parser(
        "port",
        help="write a trial folder for a LightningModule",
        description="Write a Determined trial folder (const.yaml, model_def.py) that trains "
        "the LightningModule TARGET.",
    )
    port.add_argument("target", metavar="TARGET", help="module:LightningModuleClass")
    port.add_argument("--datamodule", default=None, metavar="DM", help="module:DataModuleClass")
    port.add_argument("--out", required=True, type=pathlib.Path, metavar="DIR")
    port.add_argument("--force", action="store_true", help="overwrite files in DIR")
    port.set_defaults(handler="port")

    # One trial from its run description: the other ranks of a run, or a searcher's trial.
    hidden = commands.add_parser("_trial")
    hidden.add_argument("run_file", metavar="RUN_FILE")
    hidden.set_defaults(handler="_trial")
    return parser
