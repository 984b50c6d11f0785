"""Differential check: the simulator (sim.twin) against a real vLLM server.

`python -m sim.diffcheck record` sends the request corpus (corpus.py) to one server and
writes a snapshot (probe.py); `compare` puts two snapshots or live servers side by side and
prints one row per difference (compare.py), each either a simulator bug or a deliberate
difference listed in docs/simulator.md.
"""
