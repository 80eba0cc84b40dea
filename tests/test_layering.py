"""Dependencies point one way: sandstorm_site → mcpserver → oauth → audit, and the executor needs none of them.

Read from the sources (every import statement, at any depth, including those inside functions), so an import that
only runs on some path is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLOORS = ("sandstorm_site", "mcpserver", "oauth", "audit")  # each may import only the ones after it


def imports_of(directory: Path) -> set[tuple[str, str]]:
    """(file, top-level package imported) for every absolute import in the sources under `directory`."""
    found = set()
    for source in directory.rglob("*.py"):
        where = str(source.relative_to(directory.parent))
        for node in ast.walk(ast.parse(source.read_text(), where)):
            if isinstance(node, ast.Import):
                found |= {(where, alias.name.split(".")[0]) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add((where, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("floor", FLOORS[1:])
def test_no_floor_imports_a_floor_above_it(floor: str) -> None:
    above = set(FLOORS[: FLOORS.index(floor)])
    offending = sorted((where, package) for where, package in imports_of(REPO / floor) if package in above)
    assert offending == []


def test_the_executor_imports_nothing_of_django_or_the_other_floors() -> None:
    forbidden = {"django", "sandstorm_site", "oauth", "audit", "channels", "daphne"}
    imports = imports_of(REPO / "mcpserver" / "executor")
    offending = sorted((where, package) for where, package in imports if package in forbidden)
    assert offending == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "late.py").write_text("def later() -> None:\n    from mcpserver.dispatch import dispatch\n")
    assert imports_of(tmp_path / "audit") == {("audit/late.py", "mcpserver")}
