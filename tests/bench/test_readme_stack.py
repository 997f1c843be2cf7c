"""`bench serve`'s mlxq row is `mlxq run` as the README starts it (bench/readme_stack.py): the
supervised stack with its model pool, whose peak memory is the sum over every process it
started, the pool's workers included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import systems
from bench.readme_stack import readme_stack
from shared.queue.config import Settings
from tests.support import MODEL


def _command(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")


@pytest.fixture(scope="module")
def stack() -> Iterator[systems.Running]:
    models = Settings().models_dir
    with readme_stack(models / MODEL, models) as running:
        yield running


def test_the_mlxq_row_is_mlxq_run_with_its_pool_and_workers(stack: systems.Running) -> None:
    assert stack.tree is not None
    assert _command(stack.tree)[-1] == "run"
    commands = [" ".join(_command(pid)) for pid in systems.memory_pids(stack)]
    assert any(c.endswith("mlxq pool") for c in commands)
    assert any(c.endswith("worker.ops.cli worker") for c in commands)  # the model's worker


def test_its_peak_memory_counts_every_process_of_the_stack(stack: systems.Running) -> None:
    assert stack.tree is not None
    pids = systems.memory_pids(stack)
    systems.warm(stack)
    whole, root = systems.peak_memory_mb(pids), systems.peak_memory_mb([stack.tree])
    assert whole is not None and root is not None
    assert whole > root + 300  # a worker holding the model weighs hundreds of MB
