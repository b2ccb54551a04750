"""Device profiles: measured, stored, or derived from public peak numbers."""
