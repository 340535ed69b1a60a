"""Measuring builds: correctness against a reference, speed, a results store, tuning, presets."""
