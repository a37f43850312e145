"""Model clients: the `LLMClient` protocol, OpenAI-compatible and Anthropic adapters."""
