"""Each trial of a search runs in its own copy of the experiment folder, as each trial of
Determined runs in a container with its own copy of the context directory: a startup hook or
a trial writing relative files never meets another trial, and the user's folder stays as it
was. The copy honours `.detignore` (what it leaves out is linked, so relative paths to data
keep working) and never holds the workspace or checkpoints.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import textwrap

import pytest

from lightning_bridge.experiment.trials._workdir import sync
from lightning_bridge.record._registry import Registry
from tests import _folders as sf


def _folder(root: pathlib.Path) -> pathlib.Path:
    folder = root / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "model_def.py").write_text("VALUE = 1\n")
    (folder / "sub" / "helpers.py").write_text("HELP = 2\n")
    (folder / ".detignore").write_text("data/\n*.log\n")
    (folder / "data").mkdir()
    (folder / "data" / "train.bin").write_bytes(b"\0" * 4096)
    (folder / "notes.log").write_text("old run\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "model_def.cpython-311.pyc").write_bytes(b"x")
    (folder / "workspace").mkdir()  # a workspace inside the folder
    (folder / "workspace" / "registry.sqlite").write_bytes(b"")
    (folder / "ckpt").mkdir()  # a checkpoint written into the folder by an earlier run
    (folder / "ckpt" / "metadata.json").write_text("{}")
    (folder / "ckpt" / "state_dict.pth").write_bytes(b"")
    (root / "datasets").mkdir()  # data kept elsewhere, linked into the folder
    (root / "datasets" / "test.bin").write_bytes(b"1")
    (folder / "test-data").symlink_to(root / "datasets")
    (folder / ".nox" / "venv").mkdir(parents=True)  # a tool's cache, tagged as one
    (folder / ".nox" / "CACHEDIR.TAG").write_text(TAG)
    (folder / ".nox" / "venv" / "site.py").write_text("")
    return folder


TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# a cache\n"


def test_a_working_copy_is_made_as_determined_makes_a_context(tmp_path: pathlib.Path) -> None:
    folder = _folder(tmp_path)
    dest = tmp_path / "trial" / "workdir"
    done = sync(folder, dest, [folder / "workspace"])
    copied = sorted(
        p.relative_to(dest).as_posix()
        for p in dest.rglob("*")
        if p.is_file() and not p.is_symlink()
    )
    assert copied == ["model_def.py", "sub/helpers.py"]
    assert not (dest / "workspace").exists() and not (dest / "ckpt").exists()
    assert not (dest / "__pycache__").exists() and not (dest / ".detignore").exists()
    # What .detignore leaves out is reachable by its relative path, not copied.
    assert (dest / "data").is_symlink() and (dest / "notes.log").is_symlink()
    assert (dest / "data" / "train.bin").read_bytes() == b"\0" * 4096
    assert (dest / "test-data" / "test.bin").read_bytes() == b"1"  # a linked folder too
    assert (dest / ".nox").is_symlink()  # a cache: linked as it is, never walked
    assert (done.copied, done.unchanged) == (2, 0)
    assert (
        "linked, not copied (.detignore leaves them out, a link or a cache): .nox, data, "
        "test-data, notes.log" in (done.describe())
    )

    # The copy is the trial's: what it changes there leaves the folder as it was.
    (dest / "model_def.py").write_text("VALUE = 'changed by the trial'\n")
    (dest / "output.txt").write_text("written by the trial\n")
    assert (folder / "model_def.py").read_text() == "VALUE = 1\n"
    assert not (folder / "output.txt").exists()


def test_a_continued_trial_reuses_its_copy(tmp_path: pathlib.Path) -> None:
    folder = _folder(tmp_path)
    dest = tmp_path / "trial" / "workdir"
    sync(folder, dest, [folder / "workspace"])
    (dest / "output.txt").write_text("written by the trial\n")
    (dest / "downloaded").mkdir()
    # The user fixes a file before continuing: only that one is copied again.
    (folder / "sub" / "helpers.py").write_text("HELP = 3\n")
    again = sync(folder, dest, [folder / "workspace"])
    assert (again.copied, again.unchanged) == (1, 1)
    assert (dest / "sub" / "helpers.py").read_text() == "HELP = 3\n"
    assert (dest / "output.txt").read_text() == "written by the trial\n"
    assert (dest / "downloaded").is_dir() and (dest / "data").is_symlink()


# ----- a search's trials, end to end ----------------------------------------------------------

# Each trial's hook writes its id to one relative file, waits until the other trial's hook has
# written too, reads the file back and removes it: in one shared folder, one trial reads the
# other's id (or no file) and its hook fails. Then it leaves a file of its own.
HOOK = """
id=$(basename "$(dirname "$LIGHTNING_BRIDGE_EXPERIMENT")")
test -f data/value.txt
echo "$id" > shared.txt
touch {barrier}/"$id"
for i in $(seq 600); do [ "$(ls {barrier} | wc -l)" -ge 2 ] && break; sleep 0.05; done
test "$(cat shared.txt)" = "$id"
rm shared.txt
echo "$id" > mine.txt
"""


@pytest.mark.search
@pytest.mark.processes
def test_concurrent_trials_each_run_in_their_own_copy(tmp_path: pathlib.Path) -> None:
    config = copy.deepcopy(sf.SEARCH_CONFIG)
    config["searcher"] = {
        "name": "random",
        "metric": "validation_loss",
        "max_trials": 2,
        "max_length": {"batches": 4},
        "max_concurrent_trials": 2,
    }
    trial = sf.Trial(
        sf.TINY_MODEL_DEF.replace(
            '        (run_dir / "seen.json")',
            '        pathlib.Path("from-trial.json").write_text(json.dumps({"seed": '
            "context.get_trial_seed()}))\n"
            '        (run_dir / "seen.json")',
        ),
        config,
        config_file="search.yaml",
    )
    path = sf.write_folder(tmp_path, config, "folder", trial)
    folder = path.parent
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    (folder / "startup-hook.sh").write_text(textwrap.dedent(HOOK.format(barrier=barrier)))
    (folder / ".detignore").write_text("data/\n")
    (folder / "data").mkdir()
    (folder / "data" / "value.txt").write_text("5\n")
    before = sorted(os.listdir(folder))
    workspace = tmp_path / "workspace"
    process = sf.start(
        ["run", str(path), "--workspace", str(workspace)], tmp_path, tmp_path / "log"
    )
    out = sf.finish_logged(process, tmp_path / "log")
    assert process.returncode == 0, out

    with Registry(workspace) as registry:
        trials = registry.trials(1)
    assert [t.state for t in trials] == ["COMPLETED", "COMPLETED"], out
    assert len(os.listdir(barrier)) == 2  # both hooks were in their critical part at once
    for recorded in trials:
        work = pathlib.Path(recorded.run_dir) / "workdir"
        assert (work / "mine.txt").read_text() == f"{recorded.id}\n"
        assert json.loads((work / "from-trial.json").read_text()) == {"seed": recorded.seed}
        assert (work / "model_def.py").read_text() == (folder / "model_def.py").read_text()
        assert not (work / "shared.txt").exists()
        log = (pathlib.Path(recorded.run_dir) / "trial.log").read_text()
        assert f"runs in its own copy of the experiment folder {folder}: {work}" in log
    # The user's folder is as it was: what the trials wrote is in their copies.
    assert sorted(os.listdir(folder)) == before
