"""The settings: grouped by concern in shared/queue/config.py, each in one group, and every one
in docs/operations.md's one table under the variable that sets it."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings

from shared.queue.config import Settings

# The groups of settings, one per concern: what Settings is made of.
GROUPS = tuple(base for base in Settings.__bases__ if base is not BaseSettings)
TABLE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_every_setting_belongs_to_exactly_one_concern() -> None:
    owners: dict[str, list[str]] = {}
    for group in GROUPS:
        for name in group.model_fields:
            owners.setdefault(name, []).append(group.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    assert set(owners) == set(Settings.model_fields)


def test_the_docs_table_names_every_settings_variable() -> None:
    rows = [line for line in TABLE.read_text().splitlines() if line.startswith("| ")]
    documented = {cell.strip(" `") for row in rows for cell in row.split("|")[2:3]}
    variables = {
        "REDIS_URL" if name == "redis_url" else f"MLXQ_{name.upper()}"
        for name in Settings.model_fields
    }
    assert variables - documented == set()
