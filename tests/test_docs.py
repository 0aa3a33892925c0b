"""The README and docs/ render as written: every code fence is closed, the README's sections
are there in order, and its commands and layout table match the repository."""

from __future__ import annotations

import pathlib
import re

import pytest
from markdown_it import MarkdownIt

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *REPO.glob("*/README.md")])
README_SECTIONS = ["Install", "Run the main example", "Run the tests", "Layout", "What works"]


def _tokens(path: pathlib.Path) -> list:
    return MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))


def _sections(path: pathlib.Path) -> dict[str, list]:
    """The tokens under each second-level heading."""
    sections: dict[str, list] = {}
    current: list | None = None
    tokens = _tokens(path)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.tag == "h2":
            current = sections.setdefault(tokens[i + 1].content, [])
        elif current is not None:
            current.append(tok)
    return sections


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_code_fence_is_closed(path: pathlib.Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    for tok in _tokens(path):
        if tok.type == "fence":
            start, end = tok.map
            closing = lines[end - 1].strip() if end - 1 > start else ""
            assert closing.startswith(tok.markup), (
                f"{path.name}: the code fence opened on line {start + 1} is never closed, so "
                "everything after it renders as code"
            )


def test_readme_sections_in_order() -> None:
    assert [name for name in _sections(REPO / "README.md")] == README_SECTIONS


def _code(section: list) -> list[str]:
    return [tok.content.strip() for tok in section if tok.type == "fence"]


def test_readme_commands_are_the_ones_that_work() -> None:
    sections = _sections(REPO / "README.md")
    # The test command is the one CI runs.
    assert _code(sections["Run the tests"])[0] == "./test"
    assert re.search(r"^\./test\b", (REPO / ".ci" / "run").read_text(), re.M)
    assert (REPO / "test").stat().st_mode & 0o111
    # The main example installs torch first (pinned), then the package, then runs a config
    # that exists.
    command = _code(sections["Run the main example"])[0]
    steps = [step.strip() for step in command.split("&&")]
    assert steps[0] == "pip install torch==2.13.0"
    assert steps[1].startswith("pip install -e")
    config = steps[2].removeprefix("lightning-bridge run ").strip()
    assert steps[2].startswith("lightning-bridge run ") and (REPO / config).is_file()


def test_readme_layout_table_names_every_subpackage() -> None:
    layout = _sections(REPO / "README.md")["Layout"]
    cells = [tok.content for tok in layout if tok.type == "inline"]
    named = {c.strip("`/") for c in cells if re.fullmatch(r"`\w+/(\w+/)?`", c)}
    root = REPO / "lightning_bridge"
    top = {p.parent.name for p in root.glob("*/__init__.py")}
    rooms = {p.parent.relative_to(root).as_posix() for p in root.glob("*/*/__init__.py")}
    # A subpackage split into rooms is named by its rooms (`experiment/cli/`, ...).
    split = {room.split("/")[0] for room in rooms}
    assert named == (top - split) | rooms


def test_readme_session_table_names_the_nox_sessions() -> None:
    """The sessions the README lists are the ones noxfile.py defines (`./test -s NAME`): one
    per function under `@nox.session`, `tests` once per Lightning minor (`tests(2.6)`)."""
    noxfile = (REPO / "noxfile.py").read_text()
    minors = re.search(r"^LIGHTNING_MINORS = \[(.*?)\]", noxfile, re.M)
    assert minors is not None
    defined = set(
        re.findall(r"^@nox\.session\([^)]*\)\n(?:@nox\.parametrize.*\n)?def (\w+)\(", noxfile, re.M)
    )
    assert "tests" in defined
    defined.remove("tests")
    defined |= {f"tests({m})" for m in re.findall(r'"([\d.]+)"', minors.group(1))}
    table = _sections(REPO / "README.md")["Run the tests"]
    cells = [tok.content for tok in table if tok.type == "inline"]
    listed = {name for cell in cells for name in re.findall(r"^`([\w.()-]+)`(?:, |$)", cell)}
    listed |= {n for cell in cells for n in re.findall(r"`(tests\([\d.]+\))`", cell)}
    assert listed == defined


def test_known_bad_lightning_releases_are_excluded() -> None:
    """Lightning 2.6.2 and 2.6.3 were malicious wheels (GHSA-w37p-236h-pfx3): no requirement
    of the package admits them, and the README recommends the release that fixes
    CVE-2026-58659."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [
        Requirement(line)
        for line in [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]
    ]
    lightnings = [r for r in requirements if r.name in ("lightning", "pytorch-lightning")]
    assert {r.name for r in lightnings} == {"lightning", "pytorch-lightning"}
    for requirement in lightnings:
        for bad in ("2.6.2", "2.6.3"):
            assert not requirement.specifier.contains(bad), f"{requirement} admits {bad}"
        for good in ("2.4.0", "2.6.1", "2.6.6"):
            assert requirement.specifier.contains(good), f"{requirement} refuses {good}"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "lightning==2.6.6" in readme and "CVE-2026-58659" in readme
