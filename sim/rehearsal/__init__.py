"""Offline rehearsal of a DGX Spark pair on one Linux machine.

Nobody here has two Sparks, so the real launcher is rehearsed against two test hosts
made of network namespaces (each with its own sshd, host key and hostname), a process
runtime standing in for Docker (`bin/docker`), and the simulator standing in for vLLM
(`bin/vllm`). See docs/rehearsal.md for what this proves and what it cannot.
"""
