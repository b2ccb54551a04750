"""Benchmarks: one folder per command, and what they all share on top.

- `single/`: `tandem bench`, one request at a time, every configuration side by side in one process.
- `serve/`: `tandem bench-serve`, concurrent streaming clients against OpenAI-compatible servers.
- `cluster/`: `tandem bench-cluster`; `soak/`: `tandem soak`; `peers/`: in-process peers (`tandem bench-peer`).
- `ceiling/`: `tandem bench-ceiling`, the copy ceiling of a recorded run and Tandem's drafting replayed on it.
- `step.py`: `tandem bench-step`, what one target call costs.
- Shared: `workload` (prompts), `machine` (what a run ran on), `stats`, `markdown`, `plotting`,
  `out_dir`.
"""
