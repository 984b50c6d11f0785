"""A pair's lifecycle: ``up`` and ``down`` (updown) and their building blocks (steps:
cleanup, start one rank, wait for health)."""
