"""The package's layers import downward only (docs/ARCHITECTURE.md, "Layers"): a module's layer is its
folder; every module's imports, read from its source (`ast`, imports inside functions included), go to
a lower layer or to its own folder; no entry point imports another; `geometry` imports nothing else
of the package; and no modules import each other in a circle, inside a folder either (a lazy import
inside a function included: it hides the circle from Python, not from the reader)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pola_gnt

PACKAGE_DIR = Path(pola_gnt.__file__).parent

# The layers, lowest first: each is a folder of the package (a component), two folders for layers 2
# and 6, whose siblings do not import each other. A module's layer is its folder's; the modules directly in
# `pola_gnt/` are the entry points (`python -m pola_gnt.<command>`), and the package's `__init__`
# belongs to the bottom layer. A module imports its own folder and the layers below, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("core",)),
    ("geometry", ("geometry",)),
    ("data, attention", ("data", "attention")),
    ("model", ("model",)),
    ("evaluation", ("evaluation",)),
    ("runs", ("runs",)),
    ("apps, interop", ("apps", "interop")),
    ("api", ("api",)),
]
# The one import that goes up: the package's `__init__` exports the Python API's names, importing
# `pola_gnt.api` in its module `__getattr__` on first use of one (`import pola_gnt` stays cheap).
LAZY_EXPORTS = {("pola_gnt", "pola_gnt.api")}
ENTRY_POINTS = "entry points"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def place(module: str) -> tuple[int, str] | None:
    """(layer index, component) of a module, from its folder: `pola_gnt.<folder>.<...>` is in that
    folder's layer, `pola_gnt.<name>` (a file directly in the package) is an entry point, the package
    itself is in the bottom layer. None for a folder that is in no layer."""
    parts = module.split(".")
    if parts[0] != "pola_gnt":
        return None
    if len(parts) == 1:
        return 0, LAYERS[0][1][0]
    folder = parts[1]
    for layer, (_, components) in enumerate(LAYERS):
        if folder in components:
            return layer, folder
    if len(parts) == 2 and (PACKAGE_DIR / f"{folder}.py").is_file():
        return len(LAYERS), module
    return None


def imported_modules(source: str, module: str) -> set[str]:
    """The `pola_gnt` modules that `source` (of `module`) imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importing module's package, `level - 1` packages up
                package = module if MODULES.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                target = f"{package}.{node.module}" if node.module else package
            else:
                target = node.module or ""
            for alias in node.names:  # `from pola_gnt.attention import dispatch` imports a module
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target)
    return {name for name in found if name == "pola_gnt" or name.startswith("pola_gnt.")}


def violations(modules: dict[str, str]) -> list[str]:
    """`modules`: name -> source. The imports that break the layering, one line each."""
    problems = []
    for module, source in sorted(modules.items()):
        here = place(module)
        if here is None:
            problems.append(f"{module}: in no layer (a new folder: add it to LAYERS here and to docs/ARCHITECTURE.md)")
            continue
        for target in sorted(imported_modules(source, module)):
            there = place(target)
            if target == module or there is None or (module, target) in LAZY_EXPORTS:
                continue
            here_name = ENTRY_POINTS if here[0] == len(LAYERS) else LAYERS[here[0]][0]
            there_name = ENTRY_POINTS if there[0] == len(LAYERS) else LAYERS[there[0]][0]
            if module.startswith("pola_gnt.geometry") and not target.startswith("pola_gnt.geometry"):
                problems.append(f"{module} imports {target}: geometry imports nothing else of pola_gnt")
            elif there[0] > here[0]:
                problems.append(f"{module} ({here_name}) imports {target} ({there_name}): upward")
            elif there[0] == here[0] and there[1] != here[1]:
                kind = "another entry point" if here_name == ENTRY_POINTS else "a sibling"
                problems.append(f"{module} imports {target}: {kind} in its layer ({here_name})")
    return problems


def import_circles(modules: dict[str, str]) -> list[str]:
    """`modules`: name -> source. Each set of modules that import one another in a circle (a strongly
    connected component of the import graph with more than one module), as one line, sorted."""
    graph = {
        module: sorted(imported_modules(source, module) & modules.keys() - {module})
        for module, source in modules.items()
    }
    # Tarjan's algorithm, iterative (the package's import chains are deeper than a comfortable recursion).
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            module, next_edge = work.pop()
            if next_edge == 0:
                index[module] = lowlink[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            targets = graph[module]
            if next_edge < len(targets):
                work.append((module, next_edge + 1))
                target = targets[next_edge]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    lowlink[module] = min(lowlink[module], index[target])
                continue
            for target in targets:  # every edge seen: take the children's lowlinks
                if target in on_stack:
                    lowlink[module] = min(lowlink[module], lowlink[target])
            if lowlink[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    circles.append(" <-> ".join(sorted(component)))
    return sorted(circles)


def test_no_modules_import_each_other_in_a_circle():
    circles = import_circles({name: path.read_text() for name, path in MODULES.items()})
    assert not circles, "modules importing each other in a circle:\n" + "\n".join(circles)


@pytest.mark.parametrize(
    ("module", "planted", "imported"),
    [
        # The two circles issue 43 took out: a settings schema taking its allowed values from the
        # modules that read those settings (inside `check`, so Python never saw the circle).
        (
            "pola_gnt.data.settings",
            "from pola_gnt.data.scene_loading import SCENE_KINDS",
            "pola_gnt.data.scene_loading",
        ),
        ("pola_gnt.model.settings", "from pola_gnt.model.inference import PRECISIONS", "pola_gnt.model.inference"),
    ],
    ids=["data settings", "model settings, through the network"],
)
def test_a_planted_import_circle_fails(module, planted, imported):
    """The real tree with one lazy import added that closes a circle is caught: one circle, through both
    modules (and every module between them: `model.settings` <- `model.gnt` <- `model.inference`)."""
    modules = {name: path.read_text() for name, path in MODULES.items()}
    modules[module] += f"\ndef check():\n    {planted}\n"
    circles = import_circles(modules)
    assert len(circles) == 1
    members = circles[0].split(" <-> ")
    assert module in members and imported in members and len(members) >= 2


def test_the_settings_own_the_scene_kinds_the_loaders_table_holds():
    """`scene.kind`'s allowed values live with its schema (no import of the loaders there): the loaders'
    table has exactly those kinds."""
    from pola_gnt.data.scene_loading import SCENE_KINDS
    from pola_gnt.data.settings import SCENE_KIND_NAMES

    assert tuple(SCENE_KINDS) == SCENE_KIND_NAMES


def test_every_module_imports_downward_only():
    problems = violations({name: path.read_text() for name, path in MODULES.items()})
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_the_checker_sees_upward_sideways_and_lazy_imports():
    """The rules on made-up sources: each kind of violation is reported, allowed imports are not."""
    modules = {
        "pola_gnt.geometry.rays": "from pola_gnt.core.errors import UserError\n",
        "pola_gnt.data.llff": "def f():\n    from pola_gnt.model.gnt import GNT\n",  # upward, inside a function
        "pola_gnt.attention.modules": "import pola_gnt.data.llff\n",  # sibling of the same layer
        "pola_gnt.model.gnt": "from pola_gnt.attention import modules\nfrom pola_gnt.geometry.rays import Rays\n",
        "pola_gnt.eval": "from pola_gnt.train import train\n",  # entry point -> entry point
        "pola_gnt.train": "from pola_gnt.runs.system import GNTSystem\n",
        "pola_gnt.apps.video": "from pola_gnt.interop import pretrained\nfrom pola_gnt.runs import settings\n",
        "pola_gnt.interop.pretrained": "from pola_gnt.runs.checkpoints import read_checkpoint\n",
        "pola_gnt.runs.training": "from pola_gnt.apps.trained_runs import load_trained_checkpoint\n",
        "pola_gnt.elsewhere": "",
    }
    found = violations(modules)
    assert found == [
        "pola_gnt.apps.video imports pola_gnt.interop.pretrained: a sibling in its layer (apps, interop)",
        "pola_gnt.attention.modules imports pola_gnt.data.llff: a sibling in its layer (data, attention)",
        "pola_gnt.data.llff (data, attention) imports pola_gnt.model.gnt (model): upward",
        "pola_gnt.elsewhere: in no layer (a new folder: add it to LAYERS here and to docs/ARCHITECTURE.md)",
        "pola_gnt.eval imports pola_gnt.train: another entry point in its layer (entry points)",
        "pola_gnt.geometry.rays imports pola_gnt.core.errors: geometry imports nothing else of pola_gnt",
        "pola_gnt.runs.training (runs) imports pola_gnt.apps.trained_runs (apps, interop): upward",
    ]


@pytest.mark.parametrize(
    ("module", "planted", "reported"),
    [
        # The kind the folders used to hide: the evaluation layer reading a run's settings.
        (
            "pola_gnt.evaluation.image_metrics",
            "from pola_gnt.runs.settings import RunSettings",
            "pola_gnt.evaluation.image_metrics (evaluation) imports pola_gnt.runs.settings (runs): upward",
        ),
        # The training run reaching up to the applications or the checkpoint interop above it (they
        # were one folder with it), inside a function.
        (
            "pola_gnt.runs.training",
            "def planted():\n    from pola_gnt.apps.video import render_video",
            "pola_gnt.runs.training (runs) imports pola_gnt.apps.video (apps, interop): upward",
        ),
        (
            "pola_gnt.runs.checkpoints",
            "from pola_gnt.interop import pretrained",
            "pola_gnt.runs.checkpoints (runs) imports pola_gnt.interop.pretrained (apps, interop): upward",
        ),
        # The two siblings of the top layer stay apart.
        (
            "pola_gnt.interop.gnt_checkpoints",
            "from pola_gnt.apps.trained_runs import load_trained_checkpoint",
            "pola_gnt.interop.gnt_checkpoints imports pola_gnt.apps.trained_runs: a sibling in its layer"
            " (apps, interop)",
        ),
    ],
    ids=["evaluation->runs", "runs->apps, lazy", "runs->interop", "interop->apps"],
)
def test_a_planted_upward_import_fails(module, planted, reported):
    """The real tree with one import added that runs up a layer (or across to a sibling) is caught,
    by folder."""
    modules = {name: path.read_text() for name, path in MODULES.items()}
    modules[module] += f"\n{planted}\n"
    assert violations(modules) == [reported]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("pola_gnt", "core"),
        ("pola_gnt.core.errors", "core"),
        ("pola_gnt.geometry.cameras", "geometry"),
        ("pola_gnt.data.scene", "data, attention"),
        ("pola_gnt.evaluation.image_metrics", "evaluation"),
        ("pola_gnt.core.process", "core"),
        ("pola_gnt.model.render_memory", "model"),
        ("pola_gnt.runs.system", "runs"),
        ("pola_gnt.runs.training_budget", "runs"),
        ("pola_gnt.apps.video", "apps, interop"),
        ("pola_gnt.apps.frames", "apps, interop"),
        ("pola_gnt.interop.gnt_checkpoints", "apps, interop"),
        ("pola_gnt.interop.pretrained", "apps, interop"),
        ("pola_gnt.metrics", ENTRY_POINTS),
        ("pola_gnt.check_scene", ENTRY_POINTS),
        ("pola_gnt.view", ENTRY_POINTS),
        ("pola_gnt.convert_gnt", ENTRY_POINTS),
    ],
)
def test_a_module_is_placed_by_its_folder(module, layer):
    found = place(module)
    assert module in MODULES and found is not None
    assert (ENTRY_POINTS if found[0] == len(LAYERS) else LAYERS[found[0]][0]) == layer
