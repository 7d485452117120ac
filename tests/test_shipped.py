"""What the wheel ships stands on its own: clusterrun/ (pyproject's packages.find takes
`clusterrun*` only) never imports the test suite, whose tests/support/ holds the sandbox's test
add-ons (docs/testing.md, "What ships"). Such an import works in a checkout and fails once
installed."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_package_imports_nothing_from_the_tests() -> None:
    offenders = []
    for path in sorted((REPO / "clusterrun").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            offenders += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names
                          if name == "tests" or name.startswith("tests.")]
    assert not offenders, offenders
