"""The package's data flows one way: no module imports a module downstream of it.

The order is the one of CONTRIBUTING.md ("Architecture"): graph -> walk-length, proposal
and direction couplings -> walk sampler -> features -> operators -> kernels -> models ->
evaluation, with the experiments on top. Every module of ``gp_couple`` belongs to one
layer of :data:`LAYERS`; it may import modules of its own layer and of the layers above
it in the list, never below. Imports inside functions count too (a lazy import is still
a dependency). Package ``__init__`` modules belong to their package's layer, and the
top-level ``gp_couple/__init__.py`` (the public facade) is exempt. A module named by a
string constant in ``importlib.import_module("gp_couple....")`` is an import too.
A new module must be placed in a layer, or this test fails and says so.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gp_couple"

#: Upstream first. Entries are module names relative to ``gp_couple``; a name ending in
#: ``.*`` covers a package and everything in it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("_checks", "_nodes", "_random", "_counter_random", "_files", "_derived", "registry",
                    "settings", "optimize", "progress", "devices", "distributed", "sparse_pattern",
                    "sparse_factor", "_sparse_factor_compiled")),
    ("graphs", ("graphs",)),
    ("datasets", ("datasets.*",)),
    ("kernel families", ("kernel_families",)),
    ("couplings", ("couplings.*",)),
    ("walks", ("features._walk_compiled", "features.walks", "pagerank", "halting")),
    ("features", ("features.graph_random_features", "features._step_compiled", "features.fourier", "features.sigma_fit",
                  "features")),
    ("operators", ("operators.*", "exact", "predictive_variance")),
    ("kernels", ("kernels.*",)),
    ("models", ("marginal_likelihood", "models", "variational", "recipes", "streaming",
                "sharded_gp", "sparse_spectrum", "bayes.*")),
    ("evaluation", ("evaluation.*",)),
    ("experiments", ("experiments.*", "cli", "__main__")),
]


def module_name(path: Path) -> str:
    """``gp_couple/a/b.py`` -> ``a.b``; ``gp_couple/a/__init__.py`` -> ``a``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if member.endswith(".*"):
                package = member[:-2]
                if module == package or module.startswith(package + "."):
                    return index
            elif module == member:
                return index
    return None


def _exists(module: str) -> bool:
    base = PACKAGE.joinpath(*module.split(".")) if module else PACKAGE
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_modules(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``gp_couple`` module that ``source`` (of ``module``) imports, anywhere."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name[len("gp_couple."):]) for alias in node.names
                         if alias.name.startswith("gp_couple."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "gp_couple":
                origin = ""
            elif (node.module or "").startswith("gp_couple."):
                origin = node.module[len("gp_couple."):]
            else:
                continue
            for alias in node.names:
                # ``from .pkg import name`` imports the submodule ``pkg.name`` when there is one.
                candidate = f"{origin}.{alias.name}" if origin else alias.name
                found.append((node.lineno, candidate if _exists(candidate) else origin))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith("gp_couple.")):
            found.append((node.lineno, node.args[0].value[len("gp_couple."):]))
    return found


def _modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if path != PACKAGE / "__init__.py")


def test_every_module_has_a_layer() -> None:
    unplaced = [module_name(path) for path in _modules() if layer_of(module_name(path)) is None]
    assert not unplaced, (f"place these modules in a layer of tests/test_architecture.py::LAYERS "
                          f"(and CONTRIBUTING.md): {unplaced}")


def downstream_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """The imports of ``source`` (the text of ``module``) that point downstream, described."""
    own = layer_of(module)
    found = []
    for line, target in imported_modules(source, module, is_package=is_package):
        other = len(LAYERS) if target == "" else layer_of(target)
        if own is not None and other is not None and other > own:
            where = "the gp_couple facade" if target == "" else f"{target} ({LAYERS[other][0]})"
            found.append(f"line {line}: {module} ({LAYERS[own][0]}) imports {where}")
    return found


def test_no_module_imports_downstream() -> None:
    backward = [f"gp_couple/{path.relative_to(PACKAGE)}, {problem}" for path in _modules()
                for problem in downstream_imports(path.read_text(), module_name(path),
                                                  is_package=path.name == "__init__.py")]
    assert not backward, "imports against the data flow:\n" + "\n".join(backward)


@pytest.mark.parametrize(("source", "expected"), [
    ("from ..features.walks import walk_with_lengths", ["features.walks"]),
    ("from .walk_lengths import SigmaCoupling", ["couplings.walk_lengths"]),
    ("from .. import graphs", ["graphs"]),
    ("from ..graphs import Graph", ["graphs"]),
    ("import gp_couple.kernels.grf_kernel", ["kernels.grf_kernel"]),
    ("import numpy\nfrom scipy import sparse", []),
    ("def f():\n    from ..operators import chebyshev\n", ["operators.chebyshev"]),
    ("importlib.import_module('gp_couple.features.sigma_fit')", ["features.sigma_fit"]),
])
def test_imports_are_resolved_relative_to_the_module(source: str, expected: list[str]) -> None:
    assert [name for _, name in imported_modules(source, "couplings.sigma_matching")] == expected


def test_the_check_catches_backward_imports() -> None:
    # The two this test was written for: a coupling module sampling walks, and the
    # datasets taking the Erdos-Renyi builder from the sigma fit.
    lazy_sampler = "def fit():\n    from ..features.walks import walk_with_lengths\n"
    assert downstream_imports(lazy_sampler, "couplings.sigma_matching") == [
        "line 2: couplings.sigma_matching (couplings) imports features.walks (walks)"]
    builder = "from ..couplings.sigma_matching import default_fitting_graph"
    assert len(downstream_imports(builder, "datasets.graph_specs")) == 1
    assert downstream_imports("from ..graphs import Graph", "datasets.graph_specs") == []
    assert downstream_imports("from .. import couplings", "graphs") != []
