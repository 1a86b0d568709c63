"""The package's floors hold: imports point down the data path, never up, with no cycles
(function-local imports included: one may defer an import, not hide a cycle), and no module
imports another's private name."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fastdlight"

#: the floors, lowest first; a module may import its own floor's modules and any lower floor's
FLOORS = [
    ("fastdlight.arch", "fastdlight.config"),
    ("fastdlight.analysis",),
    ("fastdlight.policies",),
    ("fastdlight.schedules",),
    ("fastdlight.measure",),
    ("fastdlight.compiler",),
    ("fastdlight.search",),
    ("fastdlight.relax", "fastdlight.ops"),
    ("fastdlight.export", "fastdlight.dlight", "fastdlight.torch_backend", "fastdlight.rpc_server"),
    ("fastdlight.cli", "fastdlight.__main__"),
]


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: pathlib.Path):
    """(imported module, imported name or None) for every import of a fastdlight module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names if a.name.startswith("fastdlight"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base.startswith("fastdlight"):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    yield (sub, None) if sub in MODULES else (base, alias.name)


def _floor(module: str) -> int | None:
    for level, prefixes in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None  # the top-level package itself


EDGES = {name: sorted(set(_imports(name, path)), key=str) for name, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_floors(module):
    own = _floor(module)
    if own is None:
        return
    up = [target for target, _ in EDGES[module] if (_floor(target) or -1) > own]
    assert not up, f"{module} imports from a higher floor: {up}"


def test_no_module_imports_another_modules_private_name():
    private = [(m, t, n) for m, edges in EDGES.items() for t, n in edges
               if n and n.startswith("_") and not n.startswith("__") and t != m]
    assert not private


def test_there_are_no_import_cycles():
    graph = {m: {t for t, _ in edges if t in MODULES and t != m and not m.startswith(t + ".")}
             for m, edges in EDGES.items()}
    state, cycle = {}, []

    def visit(m, path):
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycle.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycle, " -> ".join(cycle[0])


def test_every_module_is_on_a_floor():
    assert [m for m in MODULES if _floor(m) is None] == ["fastdlight"]


def test_every_data_file_of_the_package_is_installed_with_it():
    """Files the package reads at run time (the templates' TIRx kernels) are declared package
    data, so an installed (not editable) package has them."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in PACKAGE.rglob("*"):
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts:
            package = ".".join(path.parent.relative_to(ROOT).parts)
            assert any(path.match(p) for p in declared.get(package, [])), f"{path.relative_to(ROOT)} is not package data"
