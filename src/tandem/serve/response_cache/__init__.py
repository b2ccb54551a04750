"""The response cache: finished responses reused for identical deterministic requests (memory or Redis)."""
