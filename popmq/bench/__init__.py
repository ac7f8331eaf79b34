"""Benchmarks behind `popmq bench ...` (each module one scenario)."""
