"""The shared n-gram store: draft material from earlier requests, in memory or in Redis."""
