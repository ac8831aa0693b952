"""docs/python_api.md: every ```python block of the page runs as it stands (each in an empty folder, in
this process) and writes the files it says it writes; the images are the sizes it renders."""

from __future__ import annotations

import json
import re
from pathlib import Path

import imageio.v3 as iio
import pytest

from pola_gnt.core.paths import PROJECT_ROOT

PAGE = PROJECT_ROOT / "docs" / "python_api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NAME = re.compile(r"^# example: (\w+)$", re.MULTILINE)


def page_examples() -> dict[str, str]:
    """The page's python blocks by the name on their first line (`# example: NAME`)."""
    examples = {}
    for code in BLOCK.findall(PAGE.read_text()):
        name = NAME.match(code)
        assert name is not None, f"{PAGE}: a python block without `# example: NAME` first: {code[:80]!r}"
        examples[name.group(1)] = code
    return examples


def check_render_fern(folder: Path) -> None:
    assert iio.imread(folder / "fern_rgb.png").shape == (60, 80, 3)
    assert iio.imread(folder / "fern_depth.png").shape == (60, 80, 3)


def check_score(folder: Path) -> None:
    scores = json.loads((folder / "scores.json").read_text())
    assert set(scores) == {"standard", "gnt"} and all(scores[p]["psnr"] > 15 for p in scores)
    for protocol in scores:
        assert json.loads((folder / f"eval_{protocol}" / "metrics.json").read_text())["protocol"] == protocol


def check_path_and_points(folder: Path) -> None:
    assert iio.imread(folder / "spiral_last.png").shape == (38, 50, 3)


def check_vit_block(folder: Path) -> None:
    assert not any(folder.iterdir())  # it writes nothing


CHECKS = {
    "render_fern": check_render_fern,
    "score": check_score,
    "path_and_points": check_path_and_points,
    "vit_block": check_vit_block,
}


def test_every_example_is_checked():
    assert set(page_examples()) == set(CHECKS)


@pytest.fixture
def fern_data(llff_root, lpips_alex_weights, monkeypatch):
    """The page reads fern and the LPIPS weights where the commands find them: `$POLA_GNT_DATA` and
    `$POLA_GNT_LPIPS_WEIGHTS`."""
    monkeypatch.setenv("POLA_GNT_DATA", str(llff_root))
    monkeypatch.setenv("POLA_GNT_LPIPS_WEIGHTS", str(lpips_alex_weights.parent))


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_example_runs_and_writes_what_it_says(name, request, tmp_path, monkeypatch, capsys):
    if name != "vit_block":
        request.getfixturevalue("fern_data")
    monkeypatch.chdir(tmp_path)
    code = page_examples()[name]
    exec(compile(code, f"{PAGE}:{name}", "exec"), {"__name__": f"python_api_{name}"})
    CHECKS[name](tmp_path)
    printed = capsys.readouterr().out
    with capsys.disabled():  # shown with -s: what the example printed
        print(f"\n{name}:\n{printed}")


README = PROJECT_ROOT / "README.md"
COMMANDS = PROJECT_ROOT / "docs" / "commands.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
ROW = re.compile(r"^\| `(python [^`]+)` \|", re.MULTILINE)


def test_the_readme_stays_short_and_its_commands_are_in_docs_commands():
    """At most 170 lines; the command table's rows are all in docs/commands.md, which has every command
    (`python -m pola_gnt.NAME` of each entry point) and links to the Python API; local links resolve."""
    readme = README.read_text()
    assert len(readme.splitlines()) <= 170
    commands = COMMANDS.read_text()
    assert set(ROW.findall(readme)) <= set(ROW.findall(commands))
    entry_points = {path.stem for path in (PROJECT_ROOT / "pola_gnt").glob("*.py") if "def main(" in path.read_text()}
    assert entry_points and all(f"python -m pola_gnt.{name} " in commands for name in entry_points), entry_points
    assert "docs/commands.md" in readme and "docs/python_api.md" in readme and "python_api.md" in commands
    assert "```python\nimport pola_gnt\n" in readme  # the From Python block
    for page in (README, COMMANDS, PAGE):
        for target in LINK.findall(page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.name}: {target}"
