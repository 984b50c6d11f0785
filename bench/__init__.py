"""Contamination-guarded serving benchmarks and the quality gate (bench/README.md).

Each script runs as ``python -m bench.NAME``; ``bench.benchlib`` is their shared core,
``bench.kernels`` holds the overlay micro-benchmarks, ``bench/results/`` recorded runs.
"""
