"""The running cluster: coordinator, worker classes, their Ray actors, endpoints and launch."""
