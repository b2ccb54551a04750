"""Drafters: everything that proposes draft tokens, behind one `offer` / `propose_batch` interface."""
