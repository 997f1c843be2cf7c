"""Fast paths for MLX's CPU backend: a forward's exponentials (`exponentials`) and one-row
products through cblas_sgemv (`matvec`, built from `native/`). Only model loading
(worker/engine/model.py) imports this room (tests/test_layout.py checks it)."""
