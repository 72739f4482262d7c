"""The layers keep their shape: no cycle between them or between modules, the core imports
nothing of the project, and the image's package imports only itself and the core. Read from the source (every import
statement, lazy ones inside functions too), so a new import is checked before anything runs it.
Print the graph with ``python tests/import_graph.py [--modules]``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import import_graph
from import_graph import Graph, collect, cycles, module_cycles, violations


def test_the_project_keeps_its_layers():
    assert violations(collect()) == []


def test_no_module_imports_one_that_imports_it_back():
    """Lazy imports count: a circle closed inside a function is a circle all the same."""
    found = module_cycles(collect())
    assert found == [], "import cycles between modules:\n" + "\n".join(found)


def test_the_walker_sees_lazy_and_relative_imports():
    g = collect()
    edges = {a: set() for a, _ in g.edges}
    for a, b in g.edges:
        edges[a].add(b)
    assert "infra.eks.cluster" in edges["cost.__main__"], "an import inside a function"
    assert "byo_vllm.config" in edges["byo_vllm.routes"], "a relative import"
    assert "options.core" in edges["byo_vllm.config"]
    assert g.layer("options.core.rungs") == "core" and g.layer("byo_vllm.app") == "image:byo_vllm"
    assert g.layer("options.deploy") == "cli" and g.layer("options.lmi.config") == "rungs"


def test_a_cycle_and_a_stray_image_import_are_reported():
    """The rules fail when broken: a rung importing the CLI, the image importing a service."""
    g = Graph(images={"byo_vllm"}, rungs={"options.lmi"})
    for a, b in [("options.deploy", "options.lmi"), ("options.lmi", "options.deploy"),
                 ("byo_vllm.config", "options.core"), ("byo_vllm.app", "options.contract"),
                 ("options.core.rungs", "cost.prices")]:
        g.edges[(a, b)] = {"x.py"}
    problems = violations(g)
    assert any(p.startswith("cycle between layers cli ⇄ rungs") for p in problems), problems
    assert any("byo_vllm (an image's package) imports options" in p for p in problems), problems
    assert any(p.startswith("the core imports cost") for p in problems), problems
    assert not any("byo_vllm.config" in p for p in problems), "the core is allowed"
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    g = Graph(edges={("options.x.__main__", "options.x.run"): {"x.py"},
                     ("options.x.run", "options.x.__main__"): {"run.py"}})
    assert module_cycles(g) == ["cycle between modules options.x.__main__ ⇄ options.x.run: "
                                "options.x.__main__ → options.x.run; options.x.run → options.x.__main__"]
    assert module_cycles(g)[0] in violations(g)


def test_the_command_prints_the_graph():
    done = subprocess.run([sys.executable, str(Path(import_graph.__file__))], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cost → core" in done.stdout and "violations: none" in done.stdout
