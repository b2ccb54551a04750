"""The running cluster: the router, the replica engine and drafter worker, their Ray actors, endpoints and launch."""
