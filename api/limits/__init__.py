"""What one key may take of what every key shares: requests and tokens per minute and queued
tokens (rates, shares), requests open at once (open_requests), and what it keeps in Redis
(quotas)."""
