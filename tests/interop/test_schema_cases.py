"""Determined's own config schema test cases (`schemas/test_cases/v0`, read from a Determined
git repository at v0.38.1) judged by Determined's schemas and by the bridge's config
(`bench/schema_cases.py`): the bridge differs on none. Where it runs a config Determined
refuses, it warns what Determined says or the section is one it ignores."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("jsonschema")
pytest.importorskip("referencing")

pytestmark = pytest.mark.interop

REPO = pathlib.Path(__file__).resolve().parents[2]
DETERMINED = os.environ.get("DETERMINED_GIT", "/work/.mirror/determined-ai+determined/repo")


def test_the_bridge_differs_from_determined_on_no_schema_case() -> None:
    found = subprocess.run(
        ["git", "-C", DETERMINED, "rev-parse", "--verify", "v0.38.1^{commit}"],
        capture_output=True,
    )
    if found.returncode != 0:
        pytest.skip(
            f"needs Determined's git repository with tag v0.38.1 (DETERMINED_GIT={DETERMINED})"
        )
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "schema_cases.py"), "--repo", DETERMINED,
         "--ref", "v0.38.1"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not re.search(r"^(DIFFERS|SCHEMA|UNPLACED) ", done.stdout, re.M), done.stdout
    summary = done.stdout.strip().splitlines()[-1]
    assert "differs on 0;" in summary, summary
    placed, agree = map(
        int, re.findall(r"config: (\d+); the bridge agrees with Determined on (\d+)", summary)[0]
    )
    assert placed >= 177 and agree >= 157, summary
