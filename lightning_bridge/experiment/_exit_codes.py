"""The exit codes of `lightning-bridge` and of the jobs and processes it starts.

0 success; 1 a failed run (the trial's error); 2 bad input (command line, config, entrypoint,
checkpoint argument, unknown id); 3 a job whose node cannot reach a service every trial
reports to (the experiment record, a search's storage). A script's own non-zero exit code is
passed on as it is.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
