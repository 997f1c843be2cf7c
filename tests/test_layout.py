"""The import rules that make the layout mean something, checked over the source's AST and in a
fresh interpreter:

- `shared` imports neither `api` nor `worker`; `shared.wire` (formats) imports nothing of the
  queue's machinery, observability or Redis.
- `api` and `worker` never import each other; the API never loads mlx.
- `api.http` (plumbing) imports no route, store or queue module of the API.
- the engine (`worker.engine`) imports nothing of Redis, RQ or Flask, not even through `shared`.
- the engine's CPU room (`worker.engine.cpu`) is imported only by model loading
  (`worker/engine/model.py`): its fast paths attach to a model as it loads, nowhere else.
- the limits (`api.limits`) know nothing of routes, stores or the broker.
- no module of `api`, `worker` or `shared` imports, through others, itself: an import for type
  checking only counts too, since it is the same circle with the knot hidden.
- no package of `api`, `shared` or `worker` holds more than 12 modules at its top: a crowded one
  is split into rooms (sub-packages) by concern, each with an `__init__` saying what it owns.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (package whose modules are checked, import prefixes it must not use)
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("shared", ("api", "worker", "flask", "mlx", "mlx_lm")),
    ("shared.wire", ("shared.queue", "shared.observe", "redis", "rq")),
    ("api", ("worker", "mlx", "mlx_lm")),
    ("api.http", ("api.routes", "api.stores", "api.queue")),
    ("api.limits", ("api.routes", "api.stores", "api.queue.broker")),
    ("worker", ("api", "flask")),
    ("worker.engine", ("redis", "rq", "flask", "worker.runtime", "worker.ops")),
]


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """Every module a source file imports (absolute names), with its line."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        for line, module in imports_of(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


@pytest.mark.parametrize(("package", "forbidden"), RULES, ids=[rule[0] for rule in RULES])
def test_a_package_imports_only_what_its_layer_allows(
    package: str, forbidden: tuple[str, ...]
) -> None:
    assert violations(package, forbidden) == []


TOP_MODULES_MAX = 12


def crowded_packages(root: Path) -> dict[str, int]:
    """Each package of `api`, `shared` and `worker` under `root` (a folder with an `__init__.py`)
    holding more than TOP_MODULES_MAX modules (`*.py` but `__init__.py`) directly in it, with
    their number."""
    counts = {
        str(init.parent.relative_to(root)): sum(
            1 for module in init.parent.glob("*.py") if module.name != "__init__.py"
        )
        for package in ("api", "shared", "worker")
        for init in (root / package).rglob("__init__.py")
    }
    return {package: n for package, n in sorted(counts.items()) if n > TOP_MODULES_MAX}


def test_no_package_holds_more_than_twelve_modules_at_its_top() -> None:
    crowded = crowded_packages(ROOT)
    assert crowded == {}, "split into rooms: " + ", ".join(f"{p} ({n})" for p, n in crowded.items())


def test_the_crowding_check_counts_a_package_s_top_only(tmp_path: Path) -> None:
    (tmp_path / "api/room").mkdir(parents=True)
    for name in ["__init__", *(f"m{i}" for i in range(TOP_MODULES_MAX + 1))]:
        (tmp_path / f"api/{name}.py").write_text("")
    for name in ["__init__", *(f"r{i}" for i in range(TOP_MODULES_MAX))]:
        (tmp_path / f"api/room/{name}.py").write_text("")
    assert crowded_packages(tmp_path) == {"api": TOP_MODULES_MAX + 1}


def test_only_model_loading_imports_the_cpu_room() -> None:
    importers = {
        str(path.relative_to(ROOT))
        for package in ("api", "shared", "worker")
        for path in (ROOT / package).rglob("*.py")
        if not path.is_relative_to(ROOT / "worker/engine/cpu")
        for _, module in imports_of(path)
        if module == "worker.engine.cpu" or module.startswith("worker.engine.cpu.")
    }
    assert importers == {"worker/engine/model.py"}


def test_the_rule_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The checker itself: an import the rules forbid is reported with its file and line."""
    source = tmp_path / "module.py"
    source.write_text("import os\nfrom worker.engine import batch\n")
    assert list(imports_of(source)) == [(1, "os"), (2, "worker.engine")]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each module of `packages` under `root` -> the modules of them it imports (`from a import
    b` imports `a.b` where that is a module)."""
    paths = {
        module_name(p, root): p for package in packages for p in (root / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        graph[name] = (imported & paths.keys()) - {name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` (its modules, the first again at the end), or []."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as found:
        return list(found.args[1])
    return []


def test_no_module_imports_itself_through_others() -> None:
    assert circle(import_graph(ROOT, ("api", "worker", "shared"))) == []


def test_the_circle_check_sees_a_type_checking_circle(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/a.py").write_text("from pkg.b import thing\n")
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    (tmp_path / "pkg/b.py").write_text(typing_only)
    found = circle(import_graph(tmp_path, ("pkg",)))
    assert set(found) == {"pkg.a", "pkg.b"} and found[0] == found[-1]


def loaded_by(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after running `statement`."""
    report = "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    code = f"import sys\n{statement}\n{report}"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def test_the_engine_loads_no_redis_rq_or_flask_even_through_shared() -> None:
    statement = (
        "import importlib, pkgutil, worker.engine as e\n"
        "for m in pkgutil.walk_packages(e.__path__, 'worker.engine.'):\n"
        "    importlib.import_module(m.name)"
    )
    assert loaded_by(statement) & {"redis", "rq", "flask", "api"} == set()


def test_the_api_app_loads_no_mlx_and_no_worker() -> None:
    loaded = loaded_by("import api.app")
    assert "flask" in loaded
    assert loaded & {"mlx", "mlx_lm", "worker"} == set()
