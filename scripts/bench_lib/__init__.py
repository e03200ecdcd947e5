"""Helpers of ``scripts/bench`` (the performance targets of DESIGN.md, measured side by side)."""
