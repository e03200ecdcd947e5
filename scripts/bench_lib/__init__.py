"""Helpers of ``scripts/bench`` (shardfs against its baselines, README.md "Performance", measured side by side)."""
