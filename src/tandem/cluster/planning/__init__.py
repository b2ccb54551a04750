"""Placement planning: which worker verifies, which drafts, with what k; predictions and reports."""
