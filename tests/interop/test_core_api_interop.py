"""The same Core API script off-cluster under Determined 0.38.1 and under the bridge: every
report it logs and every checkpoint file it stores agree."""

from __future__ import annotations

import pathlib

import pytest

from tests._core_api_runs import reports, run_script, seen, stored

pytestmark = pytest.mark.interop


def test_off_cluster_reports_and_checkpoints_match_determined(tmp_path: pathlib.Path) -> None:
    runs = {}
    for name, bridge in (("determined", False), ("bridge", True)):
        work = tmp_path / name
        work.mkdir()
        result = run_script(
            "offcluster.py", [str(work / "ck"), str(work / "out.json")], work, bridge=bridge
        )
        what = seen(work / "out.json")
        files = stored(work / "ck")
        runs[name] = {
            "reports": reports(result.stdout),
            "stored": files[what.pop("stored")],
            "uploaded": files[what.pop("uploaded")],
            "deleted gone": what.pop("deleted") not in files,
            "seen": what,
        }
    reference, ours = runs["determined"], runs["bridge"]
    assert reference["reports"], "Determined's run logged no report"
    assert ours["reports"] == reference["reports"]
    assert ours["stored"] == reference["stored"]
    assert ours["deleted gone"] and reference["deleted gone"]
    # upload(selector=) drops an unselected metadata.json on Determined; the bridge keeps it
    # (its presence marks a complete checkpoint): every other file is the same.
    assert "metadata.json" not in reference["uploaded"]
    assert ours["uploaded"].pop("metadata.json") == b'{\n  "steps_completed": 3\n}'
    assert ours["uploaded"] == reference["uploaded"]
    ours["seen"]["downloaded"].remove("metadata.json")
    assert ours["seen"] == reference["seen"]


def test_a_tutorial_script_reports_under_the_command_what_determined_reports(
    tmp_path: pathlib.Path,
) -> None:
    """Determined 0.38.1's `core_api/1_metrics.py` run directly under Determined (off-cluster:
    each report logged) and under `lightning-bridge run` (each report recorded): the same
    training and validation metrics at the same steps."""
    import ast
    import json
    import os
    import re
    import shutil
    import subprocess
    import sys

    from tests._folders import cli_env, command

    examples = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "determined_examples"
    work = tmp_path / "core_api"
    shutil.copytree(examples / "core_api", work)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "LIGHTNING_BRIDGE"))}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    theirs = subprocess.run(
        [sys.executable, "1_metrics.py"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    logged = re.findall(
        r"report_(training|validation)_metrics\(steps_completed=(\d+), metrics=(\{.*?\})\)",
        theirs.stdout + theirs.stderr,
    )
    reference = [(kind, int(step), ast.literal_eval(values)) for kind, step, values in logged]
    assert reference, "Determined's run logged no report"

    ws = tmp_path / "ws"
    ours = subprocess.run(
        command("run", "1_metrics.yaml", "--workspace", str(ws)),
        cwd=work,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ours.returncode == 0, ours.stdout[-3000:] + ours.stderr[-3000:]
    shown = subprocess.run(
        command("experiment", "describe", "1", "--json", "--workspace", str(ws)),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    (trial,) = json.loads(shown.stdout)["trials"]
    recorded = sorted(
        [("training", m["batches"], m["values"]) for m in trial["training"]]
        + [("validation", m["batches"], m["values"]) for m in trial["validation"]],
        key=lambda r: (r[1], r[0]),
    )
    assert recorded == sorted(reference, key=lambda r: (r[1], r[0]))
