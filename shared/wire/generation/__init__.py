"""What a request asks of generation beyond its prompt, in the form a job carries it: sampling
(`sampling`), structured outputs (`grammar`), tool calling (`tools`), how much to reason
(`reasoning`), and log probabilities (`logprobs`)."""
