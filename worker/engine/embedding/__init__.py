"""The embedding engine (`engine`): a sentence-transformers BERT (`encoder`) encoding many jobs'
inputs in padded forwards, and the default embedding model's preparation (`download`)."""
