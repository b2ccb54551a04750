"""Cluster mode: a coordinator over verifier and drafter workers on Ray."""
