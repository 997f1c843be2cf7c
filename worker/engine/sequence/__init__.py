"""What each sequence of the batch owns: its sampler and logits processors (a grammar among
them), its stop tokens and stop strings, its detokenizer, its log-probabilities and its tool-call
scanner (the `calls` room). A sequence that asks for none of a feature pays nothing for it."""
