"""Every import in the project, read from the source (lazy imports inside functions too), as a
graph between layers; and the rules that graph must keep.

    python tests/import_graph.py              # layer → layer edges, then any violation
    python tests/import_graph.py --modules    # module → module edges as well

Layers, top to bottom (see DESIGN.md, "Layers"): ``cli`` (options.deploy, options.bench,
options.agent, cost.__main__ and other ``__main__`` modules) → ``rungs`` (the rung folders under
options/) → shared services (the rest of ``options``, ``cost``, ``infra``) → ``core``
(options.core). Each image's package under containers/ is a layer of its own. Rules:
- no cycle between layers;
- no cycle between modules (a ``__main__`` parses and dispatches; what two modules share lives
  in a third, named for what it holds);
- the core imports nothing of the project but itself;
- the bring-your-own image's package (byo_vllm) imports nothing of the project but itself and
  the core: the image carries only those, so what the tests run is what the image runs.
  Other packages under containers/ (the gateway) are layers of their own, checked for cycles.
Exit status 1 when a rule is broken, so the test and a reader see the same thing.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

from options.core import RUNGS       # the rung folders are the core's data

REPO = Path(__file__).resolve().parents[1]

PACKAGES = ("options", "cost", "infra")      # importable from the repository root
CORE = "options.core"
CLI_MODULES = ("options.deploy", "options.bench", "options.agent", "options.cli", "options.check")
SELF_CONTAINED_IMAGES = ("byo_vllm",)        # packages whose image carries only them + the core
SKIP_DIRS = {"__pycache__", ".venv", "node_modules"}


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)       # module name → file
    images: set[str] = field(default_factory=set)                # top packages of images
    rungs: set[str] = field(default_factory=set)                 # options.<rung> packages
    edges: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # module → imported

    def layer(self, module: str) -> str:
        top = module.split(".")[0]
        if top in self.images:
            return f"image:{top}"
        if module == CORE or module.startswith(CORE + "."):
            return "core"
        if module.endswith(".__main__") or any(module == c or module.startswith(c + ".")
                                               for c in CLI_MODULES):
            return "cli"
        if any(module == r or module.startswith(r + ".") for r in self.rungs):
            return "rungs"
        return top

    def layer_edges(self) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for (a, b), _ in self.edges.items():
            la, lb = self.layer(a), self.layer(b)
            if la != lb:
                out.setdefault((la, lb), set()).add(f"{a} → {b}")
        return out


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _python_files(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        if not SKIP_DIRS & set(path.parts):
            yield path


def collect(repo: Path = REPO) -> Graph:
    g = Graph()
    for pkg in PACKAGES:
        for path in _python_files(repo / pkg):
            g.modules[_module_name(path, repo)] = path
    # An image is a folder under containers/ holding a package (its scripts and tools beside
    # the package, such as bench/, are not in the image and not walked).
    for image_dir in sorted((repo / "containers").iterdir()):
        if not image_dir.is_dir():
            continue
        for pkg_dir in sorted(p for p in image_dir.iterdir() if (p / "__init__.py").is_file()):
            g.images.add(pkg_dir.name)
            for path in _python_files(pkg_dir):
                g.modules[_module_name(path, image_dir)] = path
    g.rungs.update(r.module for r in RUNGS)
    known_tops = set(PACKAGES) | g.images
    for name, path in g.modules.items():
        is_package = path.name == "__init__.py"
        for target in imports_of(path, name, is_package):
            if target.split(".")[0] in known_tops:
                g.edges.setdefault((name, _existing(target, g.modules)), set()).add(str(path))
    return g


def _existing(target: str, modules: dict[str, Path]) -> str:
    """``pkg.mod.Name`` → ``pkg.mod``: the longest prefix that is a module of the project."""
    parts = target.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) if parts else target


def imports_of(path: Path, module: str, is_package: bool) -> set[str]:
    """Every module ``path`` imports, wherever the import statement is (``from a import b``
    gives ``a.b``, resolved to a module later)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)              # importlib.import_module("literal")
    return out


def cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def module_cycles(g: Graph) -> list[str]:
    """Each cycle between the project's modules, with the imports that close it."""
    out = []
    for component in cycles(g.edges):
        inside = sorted(f"{a} → {b}" for a, b in g.edges if a in component and b in component)
        out.append(f"cycle between modules {' ⇄ '.join(component)}: " + "; ".join(inside))
    return out


def violations(g: Graph) -> list[str]:
    problems = module_cycles(g)
    layer_edges = g.layer_edges()
    for component in cycles(layer_edges):
        inside = sorted(e for (a, b), es in layer_edges.items()
                        if a in component and b in component for e in es)
        problems.append(f"cycle between layers {' ⇄ '.join(component)}: " + "; ".join(inside))
    for (a, b), es in sorted(layer_edges.items()):
        if a == "core":
            problems.append(f"the core imports {b}: it must import nothing of the project "
                            f"({'; '.join(sorted(es))})")
        elif a[6:] in SELF_CONTAINED_IMAGES and b != "core":
            problems.append(f"{a[6:]} (an image's package) imports {b}: the image carries only "
                            f"its own package and the core ({'; '.join(sorted(es))})")
    return problems


def main(argv: list[str]) -> int:
    g = collect()
    layer_edges = g.layer_edges()
    print("layer → layer (importing modules → imported modules)")
    for (a, b), es in sorted(layer_edges.items()):
        print(f"  {a} → {b}: {len(es)} import(s)")
        if "--modules" in argv:
            for e in sorted(es):
                print(f"      {e}")
    problems = violations(g)
    print("violations:" if problems else "violations: none")
    for p in problems:
        print(f"  {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
