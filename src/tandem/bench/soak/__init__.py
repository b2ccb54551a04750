"""`tandem soak`: hold a server under a closed loop for a long time and watch it for leaks."""
