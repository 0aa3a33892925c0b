"""The `lightning-bridge` command: `run` a Determined experiment folder, `port` a Lightning one.

    lightning-bridge run const.yaml [CONTEXT_DIR] [--set KEY.PATH=VALUE ...] [--test]
        [--resume CKPT] [--devices N] [--accelerator A] [--precision P] [--strategy S]
    lightning-bridge port package.module:MyLightningModule --out DIR [--datamodule DM] [--force]

Exit codes: 0 success; 2 bad input (command line, config, entrypoint, checkpoint argument);
1 a failed run (the trial's error; a script's own exit code when it fails). docs/cli.md has the
details.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import pathlib
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from lightning_bridge._errors import BridgeError, CheckpointWriteError, InvalidArgumentError

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-bridge",
        description="Run Determined trials on PyTorch Lightning.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run a Determined experiment folder (const.yaml + trial code)",
        description="Run the experiment CONFIG describes, with the code in CONTEXT_DIR, on "
        "Lightning: what `det e create CONFIG CONTEXT_DIR` would run on a cluster.",
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
        help="continue from a checkpoint: its directory, its id, or 'latest'",
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
    run.set_defaults(handler=_run)

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
    return parser


def _is_chief() -> bool:
    """Lightning's launcher re-runs this command for ranks > 0; they print nothing extra."""
    return (
        int(os.environ.get("LOCAL_RANK", "0") or 0) == 0
        and int(os.environ.get("RANK", "0") or 0) == 0
    )


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        if math.isfinite(value) and value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-4):
            return f"{value:.6e}"
        return f"{value:.6f}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return _format_value(number)


def format_summary(result: Any) -> str:
    """The end-of-run table: last validation metrics, then where the checkpoints are."""
    lines = []
    metrics = result.metrics or {}
    if metrics:
        width = max(len("metric"), *(len(str(k)) for k in metrics))
        lines.append("Last validation metrics")
        lines.append(f"  {'metric':<{width}}  value")
        lines.append(f"  {'-' * width}  {'-' * 12}")
        for name in sorted(metrics):
            lines.append(f"  {name:<{width}}  {_format_value(metrics[name])}")
    else:
        lines.append("No validation ran.")
    existing = [p for p in result.checkpoints if pathlib.Path(p).is_dir()]
    lines.append(f"Checkpoint directory: {result.checkpoint_dir}")
    if existing:
        lines.append("Checkpoints written (kept):")
        lines.extend(f"  {p}" for p in existing)
    else:
        lines.append("No checkpoint was kept.")
    return "\n".join(lines)


def _canonical_argv(args: argparse.Namespace, plan: Any) -> list[str]:
    """This command with absolute paths: Lightning's launcher re-runs `sys.argv` for the other
    ranks, and they start in the context directory."""
    argv = [sys.argv[0], "run", str(pathlib.Path(args.config).resolve()), str(plan.context_dir)]
    for item in args.overrides:
        argv += ["--set", item]
    if args.test:
        argv.append("--test")
    if args.force:
        argv.append("--force")
    if plan.options.resume is not None:
        argv += ["--resume", plan.options.resume]
    for name in ("devices", "accelerator", "precision", "strategy"):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name}", str(value)]
    return argv


def _run(args: argparse.Namespace, from_command_line: bool) -> int:
    from lightning_bridge.experiment import _runner

    options = _runner.Options(
        overrides=list(args.overrides),
        test_mode=bool(args.test),
        resume=args.resume,
        devices=args.devices,
        precision=args.precision,
        strategy=args.strategy,
        accelerator=args.accelerator,
    )
    chief = _is_chief()
    try:
        plan = _runner.prepare(args.config, args.context_dir, options)
        warning = _runner.unused_warning(plan)
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if warning and chief:
        logger.warning(warning)
    if chief and not _oversubscription_allowed(plan, args):
        return EXIT_USAGE
    if from_command_line:
        sys.argv[:] = _canonical_argv(args, plan)
    try:
        ended, result = _runner.execute(plan)
    except InvalidArgumentError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointWriteError as exc:
        if chief:  # the chief's failure, shared with every process
            print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BridgeError as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        traceback.print_exc()
        print("lightning-bridge: error: the trial failed (traceback above)", file=sys.stderr)
        return EXIT_FAILED
    if ended.code != 0:
        message = ended.describe_failure(plan.stop_timeout)
        print(f"lightning-bridge: error: {message}", file=sys.stderr)
        return ended.exit_code
    if chief:
        print(format_summary(result), flush=True)
    return EXIT_OK


def _oversubscription_allowed(plan: Any, args: argparse.Namespace) -> bool:
    """More processes than devices is refused; more than CPU cores runs (slower) with
    --force or when the user confirms at a terminal."""
    from lightning_bridge.experiment import _runner

    found = _runner.oversubscription(plan)
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
            args.force = True
            return True
    print(
        f"lightning-bridge: error: {found.message}; lower resources.slots_per_trial (or pass "
        "--devices N), or pass --force to run them oversubscribed.",
        file=sys.stderr,
    )
    return False


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


class _StderrHandler(logging.Handler):
    """Writes to whatever `sys.stderr` is at the time of the record."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _setup_logging() -> None:
    bridge = logging.getLogger("lightning_bridge")
    if not any(isinstance(h, _StderrHandler) for h in bridge.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("lightning-bridge: %(levelname)s: %(message)s"))
        bridge.addHandler(handler)
    bridge.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `lightning-bridge` and `python -m lightning_bridge`."""
    args = build_parser().parse_args(argv)
    _setup_logging()
    handler = args.handler
    try:
        return int(handler(args, from_command_line=argv is None))
    except KeyboardInterrupt:  # outside training: a fit stops on SIGINT by itself
        print("lightning-bridge: interrupted (no training was running)", file=sys.stderr)
        return 128 + signal.SIGINT
