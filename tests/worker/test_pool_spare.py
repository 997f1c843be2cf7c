"""The pool's spare worker and the budget (worker/pool/spare.py `SpareKeeper`): a spare is kept
only while it fits beside the models held, and one that no longer fits is stopped. The spare's
process is a stand-in (`sleep`): what is under test is when the keeper starts and stops one."""

from __future__ import annotations

import subprocess
import time

from worker.pool.spare import Spare, SpareKeeper


def stand_in() -> Spare:
    return Spare(subprocess.Popen(["sleep", "60"]), time.time())


def test_a_spare_starts_when_it_fits_and_nothing_loads() -> None:
    keeper = SpareKeeper(enabled=True, start=stand_in)
    keeper.keep(0.0, loading=True, fits=True)
    assert keeper.spare is None  # it would take the cores from the load
    keeper.keep(1.0, loading=False, fits=True)
    assert keeper.spare is not None
    keeper.stop()


def test_no_spare_starts_where_the_budget_has_no_room_for_it() -> None:
    keeper = SpareKeeper(enabled=True, start=stand_in)
    keeper.keep(0.0, loading=False, fits=False)
    assert keeper.spare is None


def test_a_spare_that_no_longer_fits_is_stopped() -> None:
    keeper = SpareKeeper(enabled=True, start=stand_in)
    keeper.keep(0.0, loading=False, fits=True)
    spare = keeper.spare
    assert spare is not None
    keeper.keep(1.0, loading=False, fits=False)
    assert keeper.spare is None
    assert spare.proc.poll() is not None  # its process is gone, its memory with it
