"""Peers that run in-process rather than behind an HTTP server, measured like `tandem bench-serve`'s servers."""
