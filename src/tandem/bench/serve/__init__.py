"""Serving benchmark: concurrent streaming clients against OpenAI-compatible servers.

Layout, one job per module:
- `sse`: server-sent events lines → chat-completion chunks.
- `client`: one streamed request → a `RequestRecord` (TTFT, inter-token gaps, e2e, tokens).
- `loadgen`: a closed-loop pool of C clients draining a shared request list.
- `server_kinds`: the servers compared (command line, readiness, request extras), by registry.
- `launcher`: a server subprocess started, awaited until healthy and always stopped.
- `requests`: workload prompts → request payloads per concurrency level.
- `metrics`, `results`, `report`, `plots`: figures, `results.json`, `report.md`, PNGs.
- `sweep`: every server once, every concurrency level, configs in alternating order.
- `settings`, `session`: what the command line chose, and the run from settings to files.
"""
