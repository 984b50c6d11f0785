"""Benchmarks of the two overlays' kernels (fp8 draft head on a GPU, tokenizer cache on CPU).

Recorded runs live in ``bench/results/<topic>/``, never in the folder that ships.
"""
