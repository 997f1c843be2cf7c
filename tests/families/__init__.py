"""Model families on real vocabularies: tokenizers mlx-lm loads, and tiny models that say what a
test chooses. See vocab.py and scripted.py."""
