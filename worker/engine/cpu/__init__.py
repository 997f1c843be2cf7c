"""Fast paths for MLX's CPU backend: a forward's exponentials (`exponentials`) and one-row
products through cblas_sgemv (`matvec`, built from `native/`). Each is attached to one loaded
model's layers (`attach`) and goes with that model; MLX and mlx-lm stay as they are. Only model
loading (worker/engine/model.py) imports this room (tests/test_layout.py checks it)."""
