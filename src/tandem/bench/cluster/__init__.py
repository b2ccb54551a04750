"""`tandem bench-cluster`: a cluster against a single worker on the same hardware, draft_ahead on
and off, and drafting against verifier-only decoding across the same network."""
