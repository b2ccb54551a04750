"""The OpenAI-compatible API: request bodies, routes, streaming, errors, and the text edge around the engine."""
