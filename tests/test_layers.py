"""The import rules that keep the layers apart, read from the source with ast.

- kernels/sim, the simulator, imports nothing else of trnopt (a library others can use);
- optimizer/ imports kernels/ only from its command layer (optimizer/commands);
- the cost model (optimizer/cost) imports nothing from the search (optimizer/search), and
  neither imports the command layer.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"optimizer": "trnopt.optimizer", "kernels": "trnopt.kernels", "targets": "trnopt.targets"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts[0] = PACKAGES[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every trnopt module ``path`` imports, at any depth (function-level imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    package = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("trnopt")}


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", sources("kernels/sim"), ids=lambda p: str(p.relative_to(ROOT)))
def test_simulator_imports_nothing_else_of_trnopt(path):
    bad = {m for m in imports(path) if not m.startswith("trnopt.kernels.sim")}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sources("optimizer"), ids=lambda p: str(p.relative_to(ROOT)))
def test_optimizer_imports_kernels_only_from_commands(path):
    if path.is_relative_to(ROOT / "optimizer/commands"):
        return
    bad = {m for m in imports(path) if m.startswith("trnopt.kernels")}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sources("optimizer/cost") + sources("optimizer/model"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_cost_model_and_domain_import_no_search_and_no_commands(path):
    bad = {m for m in imports(path) if m.startswith(("trnopt.optimizer.search", "trnopt.optimizer.commands"))}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_rules_see_imports():
    """The reader finds a known import, so the rules above cannot pass by reading nothing."""
    assert "trnopt.optimizer.cost.factors" in imports(ROOT / "optimizer/cost/steptime.py")
    assert "trnopt.kernels.sim.run_ranks" in imports(ROOT / "kernels/command.py")
