from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import LocalSlurm, why_not_available


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    """A real single-node Slurm cluster for the module's tests, stopped and removed afterwards."""
    if reason := why_not_available():
        pytest.skip(reason)
    with LocalSlurm() as cluster:
        yield cluster
