"""Prefix caches shared across the fleet: fetching a prompt's cache from the worker that holds it
(`prefix_fetch`), lending this worker's to others (`prefix_lend`), the tag under the fleet secret
that says a lent file comes from the fleet (`lend_tag`), and telling the fleet what it holds and
how often it hit (`prefix_report`)."""
