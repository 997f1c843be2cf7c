"""The test command's order (tests/file_order.py): whole files, the longest first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from tests import file_order


@dataclass
class _Item:
    nodeid: str


def test_files_are_ordered_longest_first_each_files_tests_together_in_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"tests/a.py": 5.0, "tests/b.py": 90.0}))
    monkeypatch.setattr(file_order, "TABLE", table)
    names = ["tests/a.py::one", "tests/a.py::two", "tests/b.py::one", "tests/new.py::one"]
    items = cast(list[Any], [_Item(n) for n in names])
    ordered = [item.nodeid for item in file_order.by_length(items)]
    assert ordered == [
        "tests/b.py::one",
        "tests/new.py::one",  # not in the table: NEW_FILE_S, 60 s
        "tests/a.py::one",
        "tests/a.py::two",
    ]


def test_a_junit_report_gives_each_files_total_seconds(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_file_order" name="a" time="1.5"/>'
        '<testcase classname="tests.test_file_order" name="b" time="2.0"/>'
        '<testcase classname="tests.test_layout" name="c" time="0.25"/>'
        '<testcase classname="tests.gone" name="d" time="9"/>'
        "</testsuite></testsuites>"
    )
    assert file_order.file_seconds(report) == {
        "tests/test_file_order.py": 3.5,
        "tests/test_layout.py": 0.2,
    }
