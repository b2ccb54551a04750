"""`tandem bench-cluster`: a cluster against a single worker on the same hardware, pipelining on
and off, and drafting against verifier-only decoding across the same network."""
