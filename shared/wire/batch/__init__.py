"""OpenAI's Batch API: the batch object and its input and output lines (`batches`), and the files
they are read from and written to (`files`)."""
