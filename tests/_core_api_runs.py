"""Running the Core API fixture scripts off-cluster as subprocesses, and reading back what
they reported (log lines) and stored (checkpoint folders): shared by the bridge's tests and
the interop tests that run the same script under Determined."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

from lightning_bridge.contract import _import_map

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "core_api"
REPO = pathlib.Path(__file__).resolve().parents[1]

# The reports a Core API script's off-cluster run logs, in Determined's words.
_REPORT = re.compile(
    r"(report_training_metrics|report_validation_metrics|report_metrics|report_progress"
    r"|progress report|SearcherOperation Complete|status|report_early_exit)\b(.*)$"
)


def run_script(
    script: str,
    args: list[str],
    work: pathlib.Path,
    *,
    bridge: bool = True,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """`python3 SCRIPT ARGS` in `work`: with the bridge's `determined` (`bridge`), or with the
    installed Determined."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["XDG_DATA_HOME"] = str(work / "xdg")
    path = [str(REPO)]
    if bridge:
        path.insert(0, str(_import_map.shim_dir(work)))
    env["PYTHONPATH"] = os.pathsep.join(path)
    result = subprocess.run(
        [python, str(FIXTURES / script), *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def reports(output: str) -> list[str]:
    """The reports in a run's log, in order, without the logger's prefix."""
    found = []
    for line in output.splitlines():
        if not line.startswith("INFO: "):
            continue
        match = _REPORT.search(line)
        if match:
            found.append(match.group(1) + match.group(2))
    return found


def stored(root: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Each checkpoint folder under `root`: its files' bytes by relative path."""
    return {
        folder.name: {
            p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        for folder in sorted(root.iterdir())
        if not folder.name.startswith(".")
    }


def seen(path: pathlib.Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
