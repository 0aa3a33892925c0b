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
