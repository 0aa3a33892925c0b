"""Instructions executed by a part of a benchmark worker: a count that load does not move.

Wall time on a small shared machine moves with the neighbours; the number of instructions a
run executes does not (callgrind's count repeats within about 0.1%). Two counters:

* ``perf``: the CPU's instruction counter through ``perf stat``, where it is readable
  (``perf stat -e instructions true`` prints a number; virtual machines often hide it). The
  worker enables and disables counting through perf's control FIFO, so imports stay out.
* ``callgrind``: valgrind's callgrind counts the instructions it executes. The worker runs
  uninstrumented (fast-ish) until it switches instrumentation on with a client request, and
  dumps the count at each phase boundary (``start-up``, ``steady``, ``wind-down``). Runs are
  about 50-100x slower than native, so counted runs are fewer and shorter than timed ones.

The driver runs the worker behind :func:`prefix` and reads the counts back
(:func:`read_counts`); the worker calls :func:`begin`, :func:`phase` and :func:`end` around its
measured part (no-ops when it is not being counted). Only the standard library is used.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pathlib
import platform
import re
import shutil
import subprocess

ENV = "BENCH_INSTRUCTIONS"  # set in a counted worker's environment: "perf:CTL:ACK" / "callgrind"
PERF_EVENT = "instructions"


def available() -> tuple[str | None, str]:
    """The counter this machine offers ("perf", "callgrind" or None) and why."""
    why = []
    if shutil.which("perf"):
        try:
            out = subprocess.run(
                ["perf", "stat", "-x,", "-e", PERF_EVENT, "true"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stderr
        except (OSError, subprocess.SubprocessError) as exc:
            out = str(exc)
        if re.match(r"^\d+,", out.strip().splitlines()[-1] if out.strip() else ""):
            return "perf", "perf stat reads the CPU's instruction counter"
        why.append("perf cannot read the instruction counter here")
    else:
        why.append("perf is not installed")
    if shutil.which("valgrind") and platform.machine() in ("x86_64", "AMD64"):
        return "callgrind", "; ".join(why) + "; valgrind's callgrind counts instead"
    why.append("valgrind (x86_64) is not installed")
    return None, "; ".join(why)


def prefix(kind: str, out_dir: pathlib.Path) -> tuple[list[str], dict[str, str]]:
    """The command prefix that runs a worker under the counter, and the environment entries
    the worker needs. Counts land in ``out_dir`` (a new directory per run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if kind == "perf":
        ctl, ack = out_dir / "ctl.fifo", out_dir / "ack.fifo"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        perf = ["perf", "stat", "-x,", "-e", PERF_EVENT, "--delay=-1"]
        perf += [f"--control=fifo:{ctl},{ack}", "-o", str(out_dir / "perf.csv"), "--"]
        return perf, {ENV: f"perf:{ctl}:{ack}"}
    if kind == "callgrind":
        grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no"]
        grind += [f"--callgrind-out-file={out_dir / 'callgrind.%p'}", "--"]
        # One OpenMP thread: valgrind runs threads one at a time, and spinning ones stall it.
        return grind, {ENV: "callgrind", "OMP_NUM_THREADS": "1"}
    raise ValueError(f"unknown instruction counter {kind!r}")


def read_counts(kind: str, out_dir: pathlib.Path) -> dict[str, int]:
    """The counts the worker's phases left in ``out_dir``: phase name -> instructions, plus
    ``total`` (every phase; with perf, the only entry)."""
    counts: dict[str, int] = {}
    if kind == "perf":
        for line in (out_dir / "perf.csv").read_text().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2].startswith(PERF_EVENT) and fields[0].isdigit():
                counts["total"] = int(fields[0])
        return counts
    for dump in sorted(out_dir.glob("callgrind.*")):
        text = dump.read_text(errors="replace")
        name = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)$", text, re.M)
        if name and total:
            counts[name.group(1).strip()] = int(total.group(1))
    if counts:
        counts["total"] = sum(counts.values())
    return counts


# ----- worker side ----------------------------------------------------------------------------


class _Callgrind:
    """Callgrind's client requests, issued through valgrind's magic x86_64 instruction
    sequence (a no-op on a real CPU) placed in an executable page: what the C macros in
    ``valgrind/callgrind.h`` expand to, without needing a compiler."""

    _BASE = (ord("C") << 24) | (ord("T") << 16)
    DUMP_STATS_AT, ZERO_STATS = _BASE + 3, _BASE + 1
    START, STOP = _BASE + 4, _BASE + 5
    _CODE = bytes.fromhex(
        "4889f8"  # mov rax, rdi     (the request block)
        "4889f2"  # mov rdx, rsi     (the default result)
        "48c1c703"
        "48c1c70d"
        "48c1c73d"
        "48c1c733"  # rol rdi, 3 / 13 / 61 / 51
        "4887db"  # xchg rbx, rbx    (the request)
        "4889d0"  # mov rax, rdx
        "c3"  # ret
    )

    def __init__(self) -> None:
        flags = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=flags)
        self._page.write(self._CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._call = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)(address)

    def request(self, code: int, arg: int = 0) -> None:
        block = (ctypes.c_size_t * 6)(code, arg, 0, 0, 0, 0)
        self._call(ctypes.addressof(block), 0)

    def dump(self, name: str) -> None:
        text = ctypes.create_string_buffer(name.encode())
        self.request(self.DUMP_STATS_AT, ctypes.addressof(text))


class _Perf:
    """``enable`` / ``disable`` through ``perf stat``'s control FIFO (acknowledged)."""

    def __init__(self, ctl: str, ack: str) -> None:
        self._ctl, self._ack = ctl, ack

    def send(self, command: str) -> None:
        with open(self._ctl, "w") as ctl:
            ctl.write(command + "\n")
        with open(self._ack) as ack:
            ack.readline()


_STATE: dict[str, object] = {}


def _counter() -> _Callgrind | _Perf | None:
    if "counter" not in _STATE:
        spec = os.environ.get(ENV, "")
        counter: _Callgrind | _Perf | None = None
        if spec == "callgrind":
            counter = _Callgrind()
        elif spec.startswith("perf:"):
            _, ctl, ack = spec.split(":", 2)
            counter = _Perf(ctl, ack)
        _STATE["counter"] = counter
    return _STATE["counter"]  # type: ignore[return-value]


def begin() -> None:
    """Start counting (the worker's measured part begins)."""
    counter = _counter()
    if isinstance(counter, _Callgrind):
        counter.request(counter.START)
        counter.request(counter.ZERO_STATS)
    elif isinstance(counter, _Perf):
        counter.send("enable")


def phase(name: str) -> None:
    """The phase that ran since :func:`begin` or the previous call is called ``name``."""
    counter = _counter()
    if isinstance(counter, _Callgrind):
        counter.dump(name)


def end(name: str) -> None:
    """The last phase is called ``name``; stop counting."""
    counter = _counter()
    if isinstance(counter, _Callgrind):
        counter.dump(name)
        counter.request(counter.STOP)
    elif isinstance(counter, _Perf):
        counter.send("disable")
