"""mlxq's benchmark: the engine alone, the peer (mlx_lm.server) and mlxq, side by side."""
