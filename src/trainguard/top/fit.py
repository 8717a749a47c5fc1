"""Fitting a table to a terminal's width (PURE): of several layouts, from the richest to the leanest,
the first whose columns fit; every column as wide as its widest cell, except those that may shrink
(a name, a message), which keep at least their floor, cut with an ellipsis, and share what is left.
So a narrow terminal loses the less important columns whole instead of squeezing every one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

GAP = 2  # the padding rich puts between two columns of a table without a box


@dataclass(frozen=True)
class Column:
    header: str
    cells: Sequence[Text]
    justify: JustifyMethod = "left"
    floor: int | None = None  # a column that may shrink down to this many cells; None: never shrinks
    share: int = 1  # of the width left over, among the columns that shrink

    @cached_property
    def natural(self) -> int:
        return max([Text(self.header).cell_len, *(cell.cell_len for cell in self.cells)])

    @property
    def least(self) -> int:
        return self.natural if self.floor is None else min(self.natural, self.floor)


def needed(columns: Sequence[Column]) -> int:
    """The fewest cells the columns can be shown in."""
    return sum(column.least for column in columns) + GAP * max(0, len(columns) - 1)


def choose(layouts: Sequence[Sequence[str]], columns: Mapping[str, Column], width: int) -> list[str]:
    """The first of ``layouts`` (each a list of column keys) that fits ``width``; else the leanest."""
    for layout in layouts:
        if needed([columns[key] for key in layout]) <= width:
            return list(layout)
    return list(layouts[-1])


def widths(columns: Sequence[Column], width: int) -> list[int]:
    """Each column's width: its least, then the room left shared among those that shrink, up to their
    natural width."""
    result = [column.least for column in columns]
    spare = width - needed(columns)
    while spare > 0:
        growing = [i for i, column in enumerate(columns) if result[i] < column.natural]
        if not growing:
            break
        shares = sum(columns[i].share for i in growing)
        given = 0
        for i in growing:
            part = min(max(1, spare * columns[i].share // shares), columns[i].natural - result[i], spare - given)
            result[i] += part
            given += part
        spare -= given
    return result


def fitted_table(columns: Sequence[Column], width: int, header_style: str = "bold") -> Table:
    """An empty rich table of ``columns`` at the widths that fit ``width``, for their cells' rows."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style=header_style)
    for column, cells in zip(columns, widths(columns, width)):
        table.add_column(column.header, justify=column.justify, width=cells, no_wrap=True, overflow="ellipsis")
    return table
