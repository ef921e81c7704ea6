"""Benchmarks for ddp-new. Figures live here, never in timed tests."""
