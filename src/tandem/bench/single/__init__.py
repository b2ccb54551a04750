"""`tandem bench`: every configuration on every prompt, one request at a time, in one process.

- `config_base`, `tandem_configs`, `peer_configs`, `registry`: what a configuration is, Tandem's
  and its peers', and the `--configs` parser.
- `models`: the models every configuration shares, loaded once.
- `harness`: the loop (warm-up, timed runs); `memory`: peak memory per configuration.
- `matching`, `metrics`, `results`, `report`, `plots`: greedy match against the references,
  figures, `results.json`, `report.md`, PNGs.
- `session`: one run from settings to files.
"""
