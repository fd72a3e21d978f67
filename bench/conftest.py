"""Benchmarks run with `make bench`; they report figures, they assert only correctness."""
