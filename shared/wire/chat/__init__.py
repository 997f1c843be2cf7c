"""OpenAI's chat and text completions: their requests (`completions`), a chat request's messages
(`chat_messages`), and the bodies and stream chunks built from a job's events (`answers`)."""
