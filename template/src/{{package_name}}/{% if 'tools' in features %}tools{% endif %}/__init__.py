"""Diagnostic tools, each run with python -m: doctor (can the ranks meet, how fast),
check_sync (do two ranks compute the same update), plot (metrics.jsonl as a PNG)."""
