"""The fleet's formats: what pool agents publish and operators order (`pool`), the catalog of
/v1/models and /health (`catalog`), and how long an idle model stays loaded (`keep_alive`)."""
