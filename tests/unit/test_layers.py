"""The layers of DESIGN section 3 hold: every import inside trainguard crosses only the lines that
layers.toml draws, and no part reaches into another part's private module."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "trainguard"
RULES = tomllib.loads((Path(__file__).with_name("layers.toml")).read_text(encoding="utf-8"))


def _part_of_module(dotted: str) -> str:
    """The part a module belongs to: ``trainguard.store.registry`` -> ``store``."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "trainguard"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    names = list(rel.parts)
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def _is_module(dotted: str) -> bool:
    base = PACKAGE.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every trainguard module (or the package itself, for its public names) that ``path`` imports,
    at any depth of the file (lazy imports inside functions count too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "trainguard"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "trainguard":
                continue
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.append((node.lineno, candidate if _is_module(candidate) else node.module))
    return found


def crossings() -> list[tuple[str, int, str, str]]:
    """(file, line, from part, imported module) for every import between two different parts."""
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _module_name(path)
        for line, target in imports_of(path):
            if _part_of_module(target) != _part_of_module(here):
                rows.append((str(path.relative_to(PACKAGE)), line, _part_of_module(here), target))
    return rows


def allowed(part: str, target_part: str) -> bool:
    may = RULES["may_import"].get(part)
    if may is None:
        return False
    return "*" in may or target_part in may or target_part in RULES["base"]


def test_every_part_of_the_package_has_a_rule():
    parts = {_part_of_module(_module_name(path)) for path in PACKAGE.rglob("*.py")}
    missing = sorted(part for part in parts if part not in RULES["may_import"] and part not in RULES["base"])
    assert not missing, f"parts with no line in layers.toml: {missing}"


def test_imports_cross_only_the_lines_the_layers_draw():
    wrong = [
        f"{file}:{line}: {part} imports {target}"
        for file, line, part, target in crossings()
        if part not in RULES["base"] and not allowed(part, _part_of_module(target))
    ]
    base_wrong = [
        f"{file}:{line}: {part} imports {target}"
        for file, line, part, target in crossings()
        if part in RULES["base"] and _part_of_module(target) not in RULES["base"]
    ]
    assert not wrong + base_wrong, "imports against DESIGN section 3:\n" + "\n".join(wrong + base_wrong)


def test_no_part_imports_another_parts_private_module():
    wrong = []
    for file, line, _part, target in crossings():
        names = target.split(".")
        if any(name.startswith("_") and not name.startswith("__") for name in names[2:]):
            wrong.append(f"{file}:{line}: imports {target}")
    assert not wrong, "private modules imported from outside their package:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("part", "target", "expected"),
    [
        ("monitor", "trainguard.supervisor.job", False),  # the exporter once read checkpoint times there
        ("report", "trainguard.supervisor.states", False),  # the run states are the store's vocabulary
        ("top", "trainguard.supervisor.states", False),
        ("demo", "trainguard.cli.diagnose", False),  # the demo drives library functions
        ("monitor", "trainguard.store.states", True),
        ("checkpoint", "trainguard.supervisor.runner", False),  # the library knows nothing of the supervisor
    ],
)
def test_the_rules_refuse_the_imports_that_once_broke_them(part, target, expected):
    assert allowed(part, _part_of_module(target)) is expected


def test_the_private_module_rule_sees_a_reach_into_checkpoint_format(tmp_path, monkeypatch):
    # The supervisor once read checkpoint sizes from trainguard.checkpoint._format.
    file = tmp_path / "probe.py"
    file.write_text("from trainguard.checkpoint._format import folder_bytes\n", encoding="utf-8")
    [(line, target)] = imports_of(file)
    assert (line, target) == (1, "trainguard.checkpoint._format")
    assert any(name.startswith("_") for name in target.split(".")[2:])
