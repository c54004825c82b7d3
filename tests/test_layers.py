"""The package tree follows the processes (pyproject.toml's import-linter contracts: the API
process never imports the engine package, torch or transformers; each layer imports only the
layers below it), and no module imports itself back through others."""

from __future__ import annotations

from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_the_layers_and_the_process_boundary_hold() -> None:
    config = str(ROOT / "pyproject.toml")
    assert lint_imports(config_filename=config, no_cache=True, no_logo=True) == 0


def test_no_module_imports_itself_back() -> None:
    graph = grimp.build_graph("service", cache_dir=None)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycles.append((importer, *back))
    assert not cycles, cycles
