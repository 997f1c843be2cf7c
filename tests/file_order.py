"""The order in which the test command hands test files to its two processes: longest first.

pytest-xdist's `--dist loadfile` hands out whole files; with `--no-loadscope-reorder` it hands
them out in collection order, where by default it takes the files with the most tests first.
That put the cluster modules, one to three tests each and the longest files of the suite, at the
end, two at once, while one process idled. Longest first is the greedy schedule for two
machines: the short files fill in at the end.

Each file's seconds are its tests' total (setup and teardown included) in a run of the test
command, kept in `durations.json` beside this module and remade from that run's
`--junitxml` report with `python -m tests.file_order REPORT.xml`; a file the table lacks counts
as NEW_FILE_S, so a new file waits behind none of the long ones.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

TABLE = Path(__file__).with_name("durations.json")
ROOT = Path(__file__).parent.parent
NEW_FILE_S = 60.0


def by_length(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with each file's items together, the longest files first (a stable sort: each
    file's own items keep their order, and so do files of equal length)."""
    seconds = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    return sorted(items, key=lambda item: -float(seconds.get(_file_of(item), NEW_FILE_S)))


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _path_of(classname: str) -> str | None:
    """The test file of a JUnit `classname` (`tests.e2e.test_x` or `tests.e2e.test_x.Case`)."""
    parts = classname.split(".")
    while parts:
        path = Path(*parts).with_suffix(".py")
        if (ROOT / path).exists():
            return path.as_posix()
        parts.pop()
    return None


def file_seconds(report: Path) -> dict[str, float]:
    """Each test file's total seconds in a JUnit report of the test command."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        path = _path_of(case.get("classname", ""))
        if path is not None:
            totals[path] += float(case.get("time", "0"))
    return {path: round(s, 1) for path, s in sorted(totals.items(), key=lambda kv: -kv[1])}


def main() -> None:
    seconds = file_seconds(Path(sys.argv[1]))
    TABLE.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"{TABLE}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main()
