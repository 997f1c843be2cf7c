"""OpenAI's Batch API: /v1/batches (`batches`) and the files a batch reads its lines from and
writes its answers to, /v1/files (`files`)."""
