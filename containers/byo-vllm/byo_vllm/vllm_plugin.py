"""A vLLM general plugin (entry point ``vllm.general_plugins`` in pyproject.toml): vLLM runs it in
every process it starts, the engine's worker included, wherever the project is installed.

``request_amx``: on a CPU with AMX tiles, vLLM's CPU attention picks its AMX kernel, and Linux
only lets a process use AMX after the process asks for it (``arch_prctl(ARCH_REQ_XCOMP_PERM)``,
which ``torch.cpu._init_amx`` makes). Something usually asks first (Inductor when it compiles,
oneDNN in some matmuls), but not always: an eager-mode engine without LoRA, started by Ray, died
of SIGILL at its first step. Asking in every engine process makes that order irrelevant; asking
twice is harmless.
"""
from __future__ import annotations


def request_amx() -> None:
    import torch

    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()
