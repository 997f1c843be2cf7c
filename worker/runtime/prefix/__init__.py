"""Prefix caches shared across the fleet: fetching a prompt's cache from the worker that holds it
(`prefix_fetch`), lending this worker's to others (`prefix_lend`), and telling the fleet what it
holds and how often it hit (`prefix_report`)."""
