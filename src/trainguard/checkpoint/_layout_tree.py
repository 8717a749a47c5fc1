"""The common ground of the layout rules: a folder's listing (``Entry`` rows), what a rule finds in it
(``Checkpoint``), the listing indexed by folder (``Tree``), why one file cannot be whole, and the
``Checkpoint`` of one folder of it. Pure: nothing here reads the disk."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One file or folder below the scanned folder. ``path`` is relative, "/"-separated."""

    path: str
    is_dir: bool = False
    size: int = 0
    mtime: float = 0.0
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""


@dataclass(frozen=True)
class Checkpoint:
    path: str  # absolute
    layout: str
    step: int | None  # the number its framework gives it (Accelerate: the save number)
    complete: bool
    problems: tuple[str, ...] = ()  # why it is not complete
    time: float = 0.0  # when it was written (the manifest's time, else the newest file's mtime)
    size_bytes: int = 0

    def describe(self) -> str:
        return f"{self.path}: {'; '.join(self.problems)}" if self.problems else self.path


class Tree:
    """The listing, indexed by folder."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.by_path: dict[str, Entry] = {}
        self.children: dict[str, list[Entry]] = {}
        for entry in entries:
            self.by_path[entry.path] = entry
            self.children.setdefault(entry.parent, []).append(entry)

    def files(self, folder: str) -> dict[str, Entry]:
        return {e.name: e for e in self.children.get(folder, []) if not e.is_dir}

    def dirs(self, folder: str) -> list[Entry]:
        return [e for e in self.children.get(folder, []) if e.is_dir]

    def below(self, folder: str) -> list[Entry]:
        prefix = f"{folder}/" if folder else ""
        return [e for e in self.by_path.values() if e.path.startswith(prefix)]


def whole(entry: Entry) -> str | None:
    """Why one file cannot be whole, or None."""
    if entry.size == 0:
        return f"{entry.path} is empty (0 bytes: cut by a kill or a power loss)"
    problem = entry.facts.get("problem")
    return f"{entry.path}: {problem}" if problem else None


def problems_of(entries: Iterable[Entry]) -> list[str]:
    return [p for p in (whole(e) for e in entries) if p]


def _newest(tree: Tree, folder: str) -> float:
    own = tree.by_path[folder].mtime if folder in tree.by_path else 0.0
    return max((e.mtime for e in tree.below(folder) if not e.is_dir), default=own)


def _size(tree: Tree, folder: str) -> int:
    return sum(e.size for e in tree.below(folder) if not e.is_dir)


def folder_checkpoint(root: str, tree: Tree, folder: str, layout: str, step: int | None, problems: list[str],
                      when: float | None = None) -> Checkpoint:  # fmt: skip
    return Checkpoint(
        path=os.path.join(root, folder) if folder else root,
        layout=layout,
        step=step,
        complete=not problems,
        problems=tuple(problems),
        time=when if when is not None else _newest(tree, folder),
        size_bytes=_size(tree, folder),
    )
