"""`python3 -m determined.launch.wrap_rank RANK [--no-redirect-stdio] [--] CMD ...`: run a
worker's command with every line it prints prefixed by its rank (`[rank=RANK] `), as
Determined's helper did for scripts that start their own worker processes. Lines end at a
newline or a carriage return (a progress bar's updates stay lines of their own). The worker's
exit code is the helper's."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO

_LINE_END = re.compile(rb"[\r\n]")
_LIMIT = 8191


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream's lines (ended by \\n or \\r, or cut at `_LIMIT` bytes), each with \\n."""
    pending = b""
    while chunk := os.read(stream.fileno(), _LIMIT):
        pending += chunk
        while (found := _LINE_END.search(pending)) is not None or len(pending) >= _LIMIT:
            cut = found.start() if found is not None else _LIMIT
            yield pending[:cut] + b"\n"
            pending = pending[found.end() :] if found is not None else pending[cut:]
    if pending:
        yield pending + b"\n"


def _forward(source: IO[bytes], target: IO[bytes], rank: str) -> None:
    prefix = f"[rank={rank}] ".encode()
    for line in _lines(source):
        os.write(target.fileno(), prefix + line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m determined.launch.wrap_rank",
        description="Run a worker's command with its output lines prefixed by its rank.",
    )
    parser.add_argument(
        "--no-redirect-stdio", action="store_true", help="accepted (output stays where it is)"
    )
    parser.add_argument("rank", help="the rank to prefix the lines with")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the worker's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the worker's command is missing")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    threads = [
        threading.Thread(target=_forward, args=(proc.stdout, sys.stdout, args.rank)),
        threading.Thread(target=_forward, args=(proc.stderr, sys.stderr, args.rank)),
    ]
    for thread in threads:
        thread.start()
    code = proc.wait()
    for thread in threads:
        thread.join()
    return code


if __name__ == "__main__":
    sys.exit(main())
