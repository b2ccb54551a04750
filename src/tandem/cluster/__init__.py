"""Cluster mode: a router over verifier replicas (each the batching engine) and drafter workers on Ray."""
