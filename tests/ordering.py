"""The order the test command hands test files to its processes: the longest first.

pytest-xdist's `loadfile` gives each process a file at a time, in collection order when it runs
with `--no-loadscope-reorder` (scripts/test.sh); by default it puts the files with the most tests
first, which on this suite are the quick unit-test files, so the heavy one-to-three-test
end-to-end modules all ran last, two at once, and the run ended on whichever was longest. Longest
first (the greedy rule for scheduling jobs on a few machines) leaves only short files for the end.

How long each file takes is measured, not guessed: `durations.json` holds each file's seconds
(setup, call and teardown of all its tests) from a run of the whole command. Only the order
matters, so a table from a loaded machine serves as well as a quiet one. A file the table does not
know yet (a new one) goes where `UNKNOWN_S` puts it. Refresh the table with

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/junit.xml
    .venv/bin/python -m tests.ordering /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import Protocol, TypeVar

TABLE = Path(__file__).with_name("durations.json")
# A new file's guess: about what an end-to-end module with its own cluster takes, so that a new
# heavy file does not end a run, at the cost of a new light one running a little early.
UNKNOWN_S = 30.0


class Test(Protocol):
    @property
    def nodeid(self) -> str: ...


T = TypeVar("T", bound=Test)


def longest_first(items: list[T], seconds: dict[str, float]) -> list[T]:
    """`items` with their files in descending measured time; each file's own order kept."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::")[0], len(first_seen))

    def key(item: T) -> tuple[float, int]:
        path = item.nodeid.split("::")[0]
        return (-seconds.get(path, UNKNOWN_S), first_seen[path])

    return sorted(items, key=key)  # stable: a file's tests keep their order


def measured() -> dict[str, float]:
    """The checked-in table; {} if there is none (every file then counts as unknown)."""
    if not TABLE.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(TABLE.read_text()).items()}


def seconds_per_file(junit_xml: Path) -> dict[str, float]:
    """Each test file's total time in a JUnit report (pytest's --junitxml)."""
    totals: Counter[str] = Counter()
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        module = max(i for i, part in enumerate(parts) if part.startswith("test_") or i == 0)
        totals["/".join(parts[: module + 1]) + ".py"] += float(case.get("time", 0))
    return {path: round(total, 1) for path, total in sorted(totals.items())}


if __name__ == "__main__":
    TABLE.write_text(json.dumps(seconds_per_file(Path(sys.argv[1])), indent=1) + "\n")
