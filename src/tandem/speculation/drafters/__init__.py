"""Drafters: everything that proposes draft tokens, behind one `propose` interface."""
