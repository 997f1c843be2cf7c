"""The test command's order: files longest first, by the checked-in table (tests/ordering.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.ordering import UNKNOWN_S, longest_first, measured, seconds_per_file


@dataclass(frozen=True)
class Node:
    nodeid: str


def test_files_go_longest_first_and_each_keeps_its_own_order() -> None:
    items = [Node(n) for n in ("a.py::one", "a.py::two", "b.py::one", "c.py::one", "b.py::two")]
    ordered = longest_first(items, {"a.py": 1.0, "b.py": 50.0, "c.py": 7.0})
    assert [i.nodeid for i in ordered] == [
        "b.py::one",
        "b.py::two",
        "c.py::one",
        "a.py::one",
        "a.py::two",
    ]


def test_a_file_the_table_does_not_know_goes_where_its_guess_puts_it() -> None:
    items = [Node("short.py::t"), Node("new.py::t"), Node("long.py::t")]
    table = {"short.py": UNKNOWN_S / 2, "long.py": UNKNOWN_S * 2}
    assert [i.nodeid for i in longest_first(items, table)] == [
        "long.py::t",
        "new.py::t",
        "short.py::t",
    ]


def test_the_table_is_read_from_a_junit_report_per_file(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.e2e.test_x" name="a" time="2.5"/>'
        '<testcase classname="tests.e2e.test_x.TestGroup" name="b" time="1.0"/>'
        '<testcase classname="tests.test_y" name="c" time="0.3"/>'
        "</testsuite></testsuites>"
    )
    assert seconds_per_file(report) == {"tests/e2e/test_x.py": 3.5, "tests/test_y.py": 0.3}


def test_the_checked_in_table_names_only_files_that_exist() -> None:
    table = measured()
    assert table, "tests/durations.json is missing or empty"
    root = Path(__file__).parent.parent
    assert [path for path in table if not (root / path).exists()] == []
    assert json.loads((root / "tests/durations.json").read_text()) == table
