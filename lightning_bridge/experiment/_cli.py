"""The `lightning-bridge` command: `run` a Determined experiment folder, read the record of
runs, `port` a Lightning project.

    lightning-bridge run const.yaml [CONTEXT_DIR] [--set KEY.PATH=VALUE ...] [--test]
        [--resume CKPT] [--devices N] [--accelerator A] [--precision P] [--strategy S]
        [--storage URL]
    lightning-bridge search-worker NAME --storage URL [--context-dir DIR]
    lightning-bridge experiment list | describe ID | continue ID | plot ID [--out FILE]
    lightning-bridge trial logs ID
    lightning-bridge checkpoint list [--experiment ID] [--best [N]] | download UUID --out DIR
    lightning-bridge port package.module:MyLightningModule --out DIR [--datamodule DM] [--force]

Every record command takes `--workspace DIR`; the reading ones `--json`. Exit codes: 0 success;
2 bad input (command line, config, entrypoint, checkpoint argument, unknown id); 1 a failed run
(the trial's error; a script's own exit code when it fails). Nothing here imports torch or
Lightning until a trial trains. docs/cli.md has the details.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pathlib
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from lightning_bridge import _logging
from lightning_bridge._errors import BridgeError, CheckpointWriteError, InvalidArgumentError
from lightning_bridge._version import __version__
from lightning_bridge.experiment._child import EntrypointFailed

logger = logging.getLogger("lightning_bridge")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
    _search_options(run)
    run.set_defaults(handler=_run)


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
    worker.set_defaults(handler=_search_worker)


def _add_record_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    parents = [common, output]

    experiment = commands.add_parser("experiment", aliases=["e"], help="the recorded experiments")
    verbs = experiment.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", parents=parents, help="list the experiments")
    listing.set_defaults(handler=_record_command("experiment_list"))
    describe = verbs.add_parser(
        "describe", parents=parents, help="an experiment's trials, metrics and checkpoints"
    )
    describe.add_argument("id", type=int, metavar="ID")
    describe.set_defaults(handler=_record_command("experiment_describe"))
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
    cont.set_defaults(handler=_continue)
    plot = verbs.add_parser(
        "plot", parents=parents, help="write a PNG of each trial's training and validation curves"
    )
    plot.add_argument("id", type=int, metavar="ID")
    plot.add_argument(
        "--out", type=pathlib.Path, default=None, metavar="FILE",
        help="the PNG to write (default: experiment-ID.png)",
    )  # fmt: skip
    plot.set_defaults(handler=_record_command("experiment_plot"))

    trial = commands.add_parser("trial", aliases=["t"], help="the recorded trials")
    trial_verbs = trial.add_subparsers(dest="verb", required=True, metavar="VERB")
    logs = trial_verbs.add_parser("logs", parents=parents, help="print a trial's log")
    logs.add_argument("id", type=int, metavar="ID")
    logs.add_argument("--tail", type=int, default=None, metavar="N", help="the last N lines")
    logs.set_defaults(handler=_record_command("trial_logs"))

    checkpoint = commands.add_parser("checkpoint", aliases=["c"], help="the kept checkpoints")
    ckpt_verbs = checkpoint.add_subparsers(dest="verb", required=True, metavar="VERB")
    ckpt_list = ckpt_verbs.add_parser("list", parents=parents, help="list checkpoints")
    ckpt_list.add_argument("--experiment", type=int, default=None, metavar="ID")
    ckpt_list.add_argument("--trial", type=int, default=None, metavar="ID")
    ckpt_list.add_argument(
        "--best", type=int, nargs="?", const=1, default=None, metavar="N",
        help="only each experiment's N best by its searcher metric (default 1)",
    )  # fmt: skip
    ckpt_list.set_defaults(handler=_record_command("checkpoint_list"))
    download = ckpt_verbs.add_parser(
        "download", parents=parents, help="copy a checkpoint from its storage to a folder"
    )
    download.add_argument("uuid", metavar="UUID")
    download.add_argument("--out", required=True, type=pathlib.Path, metavar="DIR")
    download.set_defaults(handler=_record_command("checkpoint_download"))


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
    port.set_defaults(handler=_port)

    # One trial from its run description: the other ranks of a run, or a searcher's trial.
    hidden = commands.add_parser("_trial")
    hidden.add_argument("run_file", metavar="RUN_FILE")
    hidden.set_defaults(handler=_trial)
    return parser


def _is_chief() -> bool:
    """Lightning's launcher re-runs this command for ranks > 0; they print nothing extra."""
    return (
        int(os.environ.get("LOCAL_RANK", "0") or 0) == 0
        and int(os.environ.get("RANK", "0") or 0) == 0
    )


def _run(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment import _runner

    options = _runner.Options(
        overrides=list(args.overrides),
        test_mode=bool(args.test),
        resume=args.resume,
        trust_checkpoint=bool(args.trust_checkpoint),
        devices=args.devices,
        precision=args.precision,
        strategy=args.strategy,
        accelerator=args.accelerator,
    )
    if not options.test_mode:  # a search runs its trials (test mode trains its first one)
        from lightning_bridge.experiment._search import run_search

        searched = run_search(args, options)
        if searched is not None:
            return searched
    try:
        plan = _runner.prepare(args.config, args.context_dir, options)
        warning = _runner.unused_warning(plan)
        # Loaded after the config checks, so a config error answers at once.
        from lightning_bridge.experiment import _experiments
        from lightning_bridge.experiment._checkpoints import AlreadyComplete
        from lightning_bridge.experiment._engine_settings import check_settings
        from lightning_bridge.experiment._summary import run_summary
        from lightning_bridge.record._registry import Registry

        _experiments.check_storage(plan)
        check_settings(plan)
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if warning and _is_chief():
        logger.warning(warning)
    if not _oversubscription_allowed(plan, args):
        return EXIT_USAGE
    with Registry(args.workspace) as registry:
        try:
            experiment_id, trial = _experiments.start_experiment(
                registry, plan, pathlib.Path(args.config).resolve(), args.resume
            )
        except AlreadyComplete as done:
            print(f"lightning-bridge: {done}", flush=True)
            return EXIT_OK
        except BridgeError as exc:
            print(f"lightning-bridge: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        code = _guarded(
            lambda: _experiments.run_trial(registry, plan, trial, relaunch=from_command_line)
        )
        if code == 0:
            print(run_summary(registry, experiment_id, [trial.trial_id]), flush=True)
    return code


def _guarded(run: Any) -> int:
    """Run a trial: bridge errors as one message, the trial's own errors with a traceback."""
    try:
        code = int(run())
    except EntrypointFailed as exc:  # a script ended by a signal, or not stopping after one
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return exc.code
    except CheckpointWriteError as exc:
        if _is_chief():  # the chief's failure, which every process shares
            print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except InvalidArgumentError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        traceback.print_exc()
        print("lightning-bridge: error: the trial failed (traceback above)", file=sys.stderr)
        return EXIT_FAILED
    if code != 0:
        print(f"lightning-bridge: error: the entrypoint exited with code {code}", file=sys.stderr)
        return code if code > 0 else EXIT_FAILED
    return EXIT_OK


def _oversubscription_allowed(plan: Any, args: argparse.Namespace) -> bool:
    """More processes than devices is refused; more than CPU cores runs (slower) with
    --force or when the user confirms at a terminal."""
    from lightning_bridge.experiment._engine_settings import oversubscription

    found = oversubscription(plan)
    if found is None:
        return True
    if not found.allowed:
        print(
            f"lightning-bridge: error: {found.message}; lower resources.slots_per_trial "
            "(or pass --devices N) to at most that.",
            file=sys.stderr,
        )
        return False
    if args.force:
        logger.warning("%s: running them oversubscribed (--force), slower.", found.message)
        return True
    if sys.stdin is not None and sys.stdin.isatty():
        try:
            answer = input(
                f"lightning-bridge: {found.message}; they will share the cores (slower). "
                "Run anyway? [y/N] "
            )
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            return True
    print(
        f"lightning-bridge: error: {found.message}; lower resources.slots_per_trial (or pass "
        "--devices N), or pass --force to run them oversubscribed.",
        file=sys.stderr,
    )
    return False


def _trial(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment._experiments import run_from_file

    return _guarded(lambda: run_from_file(pathlib.Path(args.run_file)))


def _search_worker(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment._search import search_worker

    return search_worker(args)


def _continue(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment._commands import experiment_continue

    return _guarded(lambda: experiment_continue(args))


def _record_command(name: str) -> Any:
    """A handler of `_commands` (imported when the command runs)."""

    def handler(args: argparse.Namespace, from_command_line: bool) -> int:
        from lightning_bridge.experiment import _commands

        try:
            return int(getattr(_commands, name)(args))
        except BridgeError as exc:
            print(f"lightning-bridge: error: {exc}", file=sys.stderr)
            return EXIT_USAGE

    return handler


def _port(args: argparse.Namespace, from_command_line: bool) -> int:
    try:
        port: Any = importlib.import_module("lightning_bridge.port._write")
    except ImportError as exc:
        print(f"lightning-bridge: error: port is not available: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        folder = port.write_trial_folder(
            args.target, args.out, datamodule=args.datamodule, force=args.force
        )
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"Wrote trial folder {folder}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `lightning-bridge` and `python -m lightning_bridge`."""
    args = build_parser().parse_args(argv)
    _logging.configure()
    args.from_command_line = argv is None
    try:
        return int(args.handler(args, from_command_line=argv is None))
    except KeyboardInterrupt:  # outside training: a fit stops on SIGINT by itself
        print("lightning-bridge: interrupted (no training was running)", file=sys.stderr)
        return 128 + signal.SIGINT
