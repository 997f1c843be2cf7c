"""What differs by kind of job around the one engine loop and job function: the generation kind
(`generation_kind`), with a batch line's work around its generation (`batch_lines`), and the
embedding kind (`embedding_kind`)."""
