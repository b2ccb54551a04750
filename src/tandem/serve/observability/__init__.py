"""What a running server shows of itself: Prometheus metrics, the dashboard's series, traces."""
