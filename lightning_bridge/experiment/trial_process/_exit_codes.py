"""The exit codes of `lightning-bridge` and of the jobs and processes it starts.

0 success; 1 a failed run (the trial's error); 2 bad input (command line, config, entrypoint,
checkpoint argument, unknown id); 3 a job whose node cannot reach a service every trial
reports to (the experiment record, a search's storage). A script's own non-zero exit code is
passed on as it is.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from lightning_bridge._errors import BridgeError, CheckpointWriteError, InvalidArgumentError
from lightning_bridge.experiment.trial_process._child import EntrypointFailed
from lightning_bridge.translation.services._trial_environment import is_chief

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def guarded(run: Callable[[], int]) -> int:
    """Run a trial: bridge errors as one message, the trial's own errors with a traceback."""
    try:
        code = int(run())
    except EntrypointFailed as exc:  # a script ended by a signal, or not stopping after one
        print(f"lightning-bridge: error: {exc}", file=sys.stderr)
        return exc.code
    except CheckpointWriteError as exc:
        if is_chief():  # the chief's failure, which every process shares
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
