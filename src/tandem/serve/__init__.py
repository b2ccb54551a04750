"""The HTTP edge: an OpenAI-compatible API over the batching engine, metrics, traces, dashboard
and caches. Text lives here and in tandem.text; the engine below works on token ids."""
