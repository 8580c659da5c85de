"""The import graph of a package, read from its source (nothing is imported): the checks behind
tests/test_layout.py (layers, circles, private names), shared with the tests that need the graph
(tests/test_types_once.py)."""
from __future__ import annotations

import ast
import dataclasses
import functools
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "bridge"
BIN = pathlib.Path(sys.executable).parent


# ---- what each module says, read from the source (nothing is imported) -------------------------

def find_modules(top: pathlib.Path, package: str = PACKAGE) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file under the package folder `top`; a
    package is named by its `__init__.py`."""
    found = {}
    for path in sorted(top.rglob("*.py")):
        parts = path.relative_to(top).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package, *parts))] = path
    return found


def home(module: str, modules: dict[str, pathlib.Path]) -> str:
    """The package a module belongs to: itself for a package (`__init__.py`), else its parent."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _owner(dotted: str, modules: dict) -> str | None:
    """The longest module of the package that `dotted` names or lies inside (a name in a module,
    a compiled extension in a package folder)."""
    while dotted and dotted not in modules:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one module's source says, in one walk of its tree, at any depth (imports inside
    functions count): its imports (line, level, module or None for `import`, ((name, asname), ...),
    whether it sits under `if TYPE_CHECKING:`),
    the private names it defines (functions, classes, methods, assigned names, attributes set on
    `self`), and its reads of private attributes (line, the name read from or None, attribute)."""
    imports: tuple
    defined: frozenset
    uses: tuple


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.cache
def facts(source: bytes) -> Facts:
    imports, defined, uses = [], set(), []
    tree = ast.parse(source)
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking(node.test)
                   for part in node.body for inner in ast.walk(part)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.append((node.lineno, 0, None, tuple((a.name, a.asname) for a in node.names),
                            id(node) in typing_only))
        elif isinstance(node, ast.ImportFrom):
            imports.append((node.lineno, node.level, node.module or "", tuple((a.name, a.asname) for a in node.names),
                            id(node) in typing_only))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            if isinstance(node.ctx, ast.Store) and base in ("self", "cls"):
                defined.add(node.attr)
            elif base not in ("self", "cls"):
                uses.append((node.lineno, base, node.attr))
    return Facts(tuple(sorted(imports)), frozenset(n for n in defined if _private(n)), tuple(sorted(uses)))


def read_facts(modules: dict) -> dict[str, Facts]:
    return {name: facts(path.read_bytes()) for name, path in modules.items()}


def import_records(module: str, fact: Facts, modules: dict, typing: bool = True
                   ) -> Iterator[tuple[int, str, str | None, str | None]]:
    """(line, imported module, name taken from it or None, the local name bound to it or None)
    for every import of the package in the module (without `typing`: those made at run time only)."""
    package = home(module, modules)
    for line, level, base, names, typing_only in fact.imports:
        if typing_only and not typing:
            continue
        if base is None:  # import a.b.c [as d]
            for name, asname in names:
                target = _owner(name, modules)
                if target is not None:
                    rest = name[len(target) + 1:]
                    yield line, target, rest.split(".")[0] if rest else None, asname if not rest else None
            continue
        if level:
            anchor = package.split(".")[:len(package.split(".")) - level + 1]
            base = ".".join(anchor + ([base] if base else []))
        target = _owner(base, modules)
        if target is None:
            continue
        for name, asname in names:
            full = f"{base}.{name}"
            if full in modules:
                yield line, full, None, asname or name
            else:
                yield line, target, None if name == "*" or base != target else name, asname or name


def import_graph(modules: dict, all_facts: dict) -> dict[str, dict[str, int]]:
    """importer -> {imported module: first line}, of the imports made at run time (at module
    level or inside functions); a module's import of itself is left out, and so are imports under
    `if TYPE_CHECKING:`, which only annotations read and which never run."""
    graph: dict[str, dict[str, int]] = {}
    for name, fact in all_facts.items():
        edges = graph.setdefault(name, {})
        for line, target, _, _ in import_records(name, fact, modules, typing=False):
            if target != name:
                edges.setdefault(target, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle (a, b, ..., a) per strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(group, graph) for group in sorted(groups)]


def _circle(group: list[str], graph: dict) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node]):
            if nxt == start:
                return paths[node] + [start]
            if nxt in members and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    raise AssertionError(f"no circle through {start} in {group}")


def _where(top: pathlib.Path, path: pathlib.Path, line: int) -> str:
    return f"{path.relative_to(top.parent).as_posix()}:{line}"


# ---- the checks written here ---------------------------------------------------------------------

def cycle_problems(top: pathlib.Path) -> list[str]:
    modules = find_modules(top)
    graph = import_graph(modules, read_facts(modules))
    return [f"import circle {' -> '.join(c)}: " + " ; ".join(
        f"{a} -> {b} ({_where(top, modules[a], graph[a][b])})" for a, b in zip(c, c[1:])) for c in import_cycles(graph)]


def root_import_problems(top: pathlib.Path) -> list[str]:
    """Modules that import the package root `bridge` itself (`import bridge`, or a name that
    `bridge/__init__.py` re-exports): the root only re-exports, so that is an upward import."""
    modules = find_modules(top)
    problems = []
    for name, fact in read_facts(modules).items():
        if name == PACKAGE:
            continue
        for line, target, taken, _ in import_records(name, fact, modules):
            if target == PACKAGE:
                what = f"the name {taken}" if taken else "the package"
                problems.append(f"{_where(top, modules[name], line)}: {name} imports {what} from the package root "
                                f"{PACKAGE}; import it from the module that defines it")
    return problems


def private_name_problems(top: pathlib.Path) -> list[str]:
    """A `_name` defined in one package and used from a module of another: imported
    (`from bridge.blob.encode import _x`), reached through an imported module or class
    (`DataHubWriter._read`, `sink._Task`), or read off an object whose private attribute only
    another package defines (`writer._read(...)`, where only bridge.datahub has a `_read`).
    Modules of one package (bridge.spark.tables and bridge.spark.jobs) share their private names."""
    modules = find_modules(top)
    all_facts = read_facts(modules)
    defined: dict[str, set[str]] = {}
    for name, fact in all_facts.items():
        defined.setdefault(home(name, modules), set()).update(fact.defined)
    problems = []
    for name, fact in all_facts.items():
        package = home(name, modules)
        bound = {}  # local name -> the package owning what it names
        for line, target, taken, local in import_records(name, fact, modules):
            if taken is not None:
                private, owner = taken, home(target, modules)
            else:  # a module: private when its own name is (a C extension `_speedups` comes as a name)
                private, owner = target.rpartition(".")[2], target.rpartition(".")[0]
            if _private(private) and owner != package:
                problems.append(f"{_where(top, modules[name], line)}: {name} imports {private} from {target}, "
                                f"private to {owner}")
            if local is not None:
                bound[local] = home(target, modules)
        for line, base, attr in fact.uses:
            if base in bound:
                if bound[base] != package:
                    problems.append(f"{_where(top, modules[name], line)}: {name} uses {base}.{attr}, "
                                    f"private to {bound[base]}")
                continue
            owners = sorted(p for p, names in defined.items() if attr in names)
            if owners and package not in owners:
                problems.append(f"{_where(top, modules[name], line)}: {name} uses .{attr}, which only "
                                f"{' and '.join(owners)} define{'s' if len(owners) == 1 else ''} (private there)")
    return problems


# ---- the tools ----------------------------------------------------------------------------------

def lint_imports(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the `bridge` package found under `cwd` (its own copy comes first)."""
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache", "--config", str(cwd / ".importlinter")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def ruff(*paths: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "--output-format", "concise", *paths],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


# ---- the checks on the package ------------------------------------------------------------------
