"""The package's layers import downward only (docs/ARCHITECTURE.md, "Layers"): every module's imports,
read from its source (`ast`, imports inside functions included), go to a lower layer or to its own
component; no entry point imports another; `geometry` imports nothing else of the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pola_gnt

PACKAGE_DIR = Path(pola_gnt.__file__).parent

# Lowest first. A module may import the layers below its own, and the modules of its own component.
LAYERS: list[tuple[str, dict[str, tuple[str, ...]]]] = [
    (
        "base",
        {
            "base": (
                "pola_gnt",
                "pola_gnt.errors",
                "pola_gnt.paths",
                "pola_gnt.runtime",
                "pola_gnt.runfiles",
                "pola_gnt.guards",
            )
        },
    ),
    ("geometry", {"geometry": ("pola_gnt.geometry",)}),
    ("data, attention", {"data": ("pola_gnt.data",), "attention": ("pola_gnt.attention",)}),
    ("model", {"model": ("pola_gnt.model",)}),
    (
        "evaluation",
        {"evaluation": ("pola_gnt.metrics", "pola_gnt.depth_metrics", "pola_gnt.stats", "pola_gnt.scoring")},
    ),
    (
        "runs",
        {
            "runs": (
                "pola_gnt.budget",
                "pola_gnt.checkpoints",
                "pola_gnt.config",
                "pola_gnt.system",
                "pola_gnt.trained_runs",
            )
        },
    ),
    (
        "entry points",
        {
            name: (f"pola_gnt.{name}",)
            for name in ("train", "eval", "render_video", "report", "analyze", "process_data", "data.__main__")
        }
        | {"metrics.__main__": ("pola_gnt.metrics.__main__",)},
    ),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def place(module: str) -> tuple[int, str] | None:
    """(layer index, component) of a module: the most specific prefix in the table wins."""
    best: tuple[int, int, str] | None = None  # (prefix length, layer, component)
    for layer, (_, components) in enumerate(LAYERS):
        for component, prefixes in components.items():
            for prefix in prefixes:
                below = module.startswith(prefix + ".") and prefix != "pola_gnt"  # the root package is itself only
                if (module == prefix or below) and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), layer, component)
    return None if best is None else (best[1], best[2])


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
            for alias in node.names:  # `from pola_gnt.attention import triton_kernel` imports a module
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target)
    return {name for name in found if name == "pola_gnt" or name.startswith("pola_gnt.")}


def violations(modules: dict[str, str]) -> list[str]:
    """`modules`: name -> source. The imports that break the layering, one line each."""
    problems = []
    for module, source in sorted(modules.items()):
        here = place(module)
        if here is None:
            problems.append(f"{module}: in no layer (add it to LAYERS here and to docs/ARCHITECTURE.md)")
            continue
        for target in sorted(imported_modules(source, module)):
            there = place(target)
            if target == module or there is None:
                continue
            if module.startswith("pola_gnt.geometry") and not target.startswith("pola_gnt.geometry"):
                problems.append(f"{module} imports {target}: geometry imports nothing else of pola_gnt")
            elif there[0] > here[0]:
                problems.append(f"{module} ({LAYERS[here[0]][0]}) imports {target} ({LAYERS[there[0]][0]}): upward")
            elif there[0] == here[0] and there[1] != here[1]:
                kind = "another entry point" if LAYERS[here[0]][0] == "entry points" else "a sibling"
                problems.append(f"{module} imports {target}: {kind} in its layer ({LAYERS[here[0]][0]})")
    return problems


def test_every_module_imports_downward_only():
    problems = violations({name: path.read_text() for name, path in MODULES.items()})
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_the_checker_sees_upward_sideways_and_lazy_imports():
    """The rules on made-up sources: each kind of violation is reported, allowed imports are not."""
    modules = {
        "pola_gnt.geometry.rays": "from pola_gnt.errors import UserError\n",
        "pola_gnt.data.llff": "def f():\n    from pola_gnt.model.gnt import GNT\n",  # upward, inside a function
        "pola_gnt.attention.modules": "import pola_gnt.data.llff\n",  # sibling of the same layer
        "pola_gnt.model.gnt": "from pola_gnt.attention import modules\nfrom pola_gnt.geometry.rays import Rays\n",
        "pola_gnt.eval": "from pola_gnt.train import train\n",  # entry point -> entry point
        "pola_gnt.train": "from pola_gnt.system import GNTSystem\n",
        "pola_gnt.elsewhere": "",
    }
    found = violations(modules)
    assert found == [
        "pola_gnt.attention.modules imports pola_gnt.data.llff: a sibling in its layer (data, attention)",
        "pola_gnt.data.llff (data, attention) imports pola_gnt.model.gnt (model): upward",
        "pola_gnt.elsewhere: in no layer (add it to LAYERS here and to docs/ARCHITECTURE.md)",
        "pola_gnt.eval imports pola_gnt.train: another entry point in its layer (entry points)",
        "pola_gnt.geometry.rays imports pola_gnt.errors: geometry imports nothing else of pola_gnt",
    ]


@pytest.mark.parametrize("module", ["pola_gnt.geometry.cameras", "pola_gnt.metrics", "pola_gnt.metrics.__main__"])
def test_every_module_has_a_place(module):
    assert module in MODULES and place(module) is not None
