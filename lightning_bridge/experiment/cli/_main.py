"""The `lightning-bridge` command: `run` a Determined experiment folder (a search's runs are
`_search_commands`'), read and steer the record of runs, mirror it to MLflow's registry,
`port` a Lightning project; argv to the handler that answers it.

    lightning-bridge run const.yaml [CONTEXT_DIR] [--set KEY.PATH=VALUE ...] [--test]
        [--resume CKPT] [--devices N] [--accelerator A] [--precision P] [--strategy S]
        [--storage URL]
    lightning-bridge search-worker NAME --storage URL [--context-dir DIR]
    lightning-bridge experiment list | describe ID | continue ID | pause ID | kill ID
        | plot ID [--out FILE] | sync ID
    lightning-bridge trial logs ID
    lightning-bridge checkpoint list [--experiment ID] [--best [N]] | download UUID --out DIR
    lightning-bridge model create | register-version | list | list-versions | describe | alias
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
import secrets
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning_bridge import _logging
from lightning_bridge._errors import (
    BridgeError,
    InvalidArgumentError,
    WorkspaceError,
)
from lightning_bridge._process import exit_now
from lightning_bridge.experiment.cli._parser import build_parser
from lightning_bridge.experiment.trial_process._exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    guarded,
)
from lightning_bridge.translation.services._trial_environment import is_chief

if TYPE_CHECKING:
    from lightning_bridge.experiment.config._config import ResolvedConfig

logger = logging.getLogger("lightning_bridge")


def _seeded(
    config: ResolvedConfig, overrides: list[str]
) -> tuple[ResolvedConfig, list[str], str | None]:
    """The config and overrides, with a random `reproducibility.experiment_seed` added when the
    config names none, as Determined draws one for every experiment: the experiment's record
    keeps it and each trial's seed derives from it. With it, the line that says so (printed
    once the run's checks pass, so the run can be repeated)."""
    if config.model.reproducibility.experiment_seed is not None:
        return config, overrides, None
    seed = secrets.randbelow(1 << 31)
    line = (
        f"Experiment seed {seed} (drawn at random; repeat the run with "
        f"--set reproducibility.experiment_seed={seed})"
    )
    return config.with_seed(seed), [*overrides, f"reproducibility.experiment_seed={seed}"], line


def _ray_address(args: argparse.Namespace) -> str | None:
    """`--address` (the Ray cluster's), exported as RAY_ADDRESS for this process: Ray's own
    setting, which wins over the address an experiment recorded."""
    address = getattr(args, "address", None)
    if address:
        os.environ["RAY_ADDRESS"] = address
    return address or None


def _run(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment.config import _plan
    from lightning_bridge.experiment.config._config import load_config
    from lightning_bridge.experiment.launch._registry import default_launcher
    from lightning_bridge.record._workspace import Workspace

    try:  # the command line's --launcher, else the workspace's setting, else local
        launcher_name = args.launcher or default_launcher(Workspace(args.workspace).root)
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:  # the one parse of the config on the way to the trial
        config, overrides, seed_line = _seeded(
            load_config(args.config, list(args.overrides)), list(args.overrides)
        )
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = _plan.Options(
        overrides=overrides,
        test_mode=bool(args.test),
        resume=args.resume,
        trust_checkpoint=bool(args.trust_checkpoint),
        devices=args.devices,
        precision=args.precision,
        strategy=args.strategy,
        accelerator=args.accelerator,
        tracking_uri=args.tracking_uri,
        launcher=launcher_name,
        worker_jobs=args.worker_jobs,
        address=_ray_address(args),
    )
    if not options.test_mode:  # a search runs its trials (test mode trains its first one)
        from lightning_bridge.experiment.cli._search_commands import run_search

        searched = run_search(args, options, config, seed_line if is_chief() else None)
        if searched is not None:
            return searched
    try:
        plan = _plan.prepare(args.config, args.context_dir, options, config)
        if options.worker_jobs is not None:
            raise InvalidArgumentError(
                "--worker-jobs runs a search's trials in Slurm worker jobs, and this run "
                "trains one trial (a single searcher, or --test); leave --worker-jobs out"
            )
        # Loaded after the config checks, so a config error answers at once.
        from lightning_bridge.experiment.cli._summary import run_summary
        from lightning_bridge.experiment.launch._preflight import preflight
        from lightning_bridge.experiment.trials import _experiments
        from lightning_bridge.experiment.trials._checkpoints import AlreadyComplete
        from lightning_bridge.record._registry import Registry

        launcher = preflight(plan, Workspace(args.workspace), new=True, engine=True)
        warning = _plan.unused_warning(plan, launcher.config_keys)
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if seed_line and is_chief():
        print(seed_line, flush=True)
    if warning and is_chief():
        logger.warning(warning)
    if not launcher.allows(plan, bool(args.force)):
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
        code = guarded(
            lambda: launcher.run_trial(registry, plan, trial, relaunch=from_command_line)
        )
        if code == 0:
            print(run_summary(registry, experiment_id, [trial.trial_id]), flush=True)
        _print_mirror(registry, experiment_id)
    return code


def _print_mirror(registry: Any, experiment_id: int) -> None:
    """Complete the experiment's MLflow mirror; print where to look at it."""
    if not is_chief():
        return
    from lightning_bridge.tracking._sync import sync_after_run

    line = sync_after_run(registry, experiment_id)
    if line:
        print(line, flush=True)


def _trial(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment.trial_process._run import run_from_file
    from lightning_bridge.experiment.trial_process._signals import held_until_training
    from lightning_bridge.translation.services._trial_environment import TrialEnvironment

    if not TrialEnvironment.current().holds_early_stop:
        return guarded(lambda: run_from_file(pathlib.Path(args.run_file)))
    with held_until_training():
        return guarded(lambda: run_from_file(pathlib.Path(args.run_file)))


def _search_worker(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment.cli._search_commands import search_worker

    return search_worker(args)


def _continue(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment.cli._record_commands import experiment_continue

    return guarded(lambda: experiment_continue(args))


def _record_command(name: str, module: str = "_record_commands") -> Any:
    """A handler of `cli._record_commands` (or `module`; imported when the command runs)."""

    def handler(args: argparse.Namespace, from_command_line: bool) -> int:
        commands = importlib.import_module(f"lightning_bridge.experiment.cli.{module}")
        try:
            return int(getattr(commands, name)(args))
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


def _handler(name: str) -> Any:
    """The function of the subcommand the parser named."""
    if name.startswith("record:"):
        return _record_command(name.removeprefix("record:"))
    if name.startswith("model:"):
        return _record_command(name.removeprefix("model:"), "_model_commands")
    handlers = {
        "run": _run,
        "search-worker": _search_worker,
        "continue": _continue,
        "port": _port,
        "_trial": _trial,
    }
    return handlers[name]


def command() -> None:
    """The `lightning-bridge` console script: `main()`, then exit without tearing down every
    module (see `_process.exit_now`)."""
    exit_now(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `lightning-bridge` and `python -m lightning_bridge`."""
    args = build_parser().parse_args(argv)
    _ray_address(args)
    handler = _handler(args.handler)
    _logging.configure()
    args.from_command_line = argv is None
    try:
        return int(handler(args, from_command_line=argv is None))
    except WorkspaceError as exc:  # the record cannot be opened: before anything was written
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # outside training: a fit stops on SIGINT by itself
        print("lightning-bridge: interrupted (no training was running)", file=sys.stderr)
        return 128 + signal.SIGINT
