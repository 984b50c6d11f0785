"""Everything that stands in for hardware we do not have here.

- ``sim.twin``: the spark twin, an offline SIMULATOR of a DSV4-Flash DSpark pair
  (``python -m sim.twin``; docs/simulator.md).
- ``sim.rehearsal``: two network-namespace test hosts with real sshd and a process
  runtime in place of Docker (``python -m sim.rehearsal``; docs/rehearsal.md).
- ``sim/profiles/``: the twin's timing profiles (YAML).
"""
