"""The project's vLLM plugin: vLLM finds it through its entry point, and on a CPU with AMX tiles it
gets the process the kernel's permission to use them (without which vLLM's AMX attention dies of
SIGILL; the Ray direct application's test serves through it in eager mode)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from byo_vllm import vllm_plugin

pytest.importorskip("vllm")


def test_vllm_loads_the_plugin_from_the_projects_entry_point():
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert plugins.get("spectrum_request_amx") is vllm_plugin.request_amx, sorted(plugins)


# The kernel's answer to arch_prctl(ARCH_GET_XCOMP_PERM): bit 18 (XTILEDATA) is AMX's permission.
PERMISSION = textwrap.dedent("""
    import ctypes, json, torch
    libc = ctypes.CDLL(None, use_errno=True)
    def allowed():
        mask = ctypes.c_ulong(0)
        assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0, ctypes.get_errno()
        return bool(mask.value >> 18 & 1)
    from byo_vllm.vllm_plugin import request_amx
    before = allowed()
    request_amx(); after = allowed()
    request_amx(); again = allowed()
    print(json.dumps({"amx": torch.cpu._is_amx_tile_supported(), "before": before,
                      "after": after, "again": again}))
""")


@pytest.mark.skipif(sys.platform != "linux", reason="arch_prctl is Linux's")
def test_the_plugin_gets_the_process_amx_where_the_cpu_has_it_and_can_run_twice():
    import json
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("AMX is x86-64's")
    done = subprocess.run([sys.executable, "-c", PERMISSION], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if not seen["amx"]:
        # Without AMX tiles the plugin asks nothing, and the process runs on as it was.
        assert seen == {"amx": False, "before": False, "after": False, "again": False}
        return
    # A fresh process (torch imported) has no permission until it asks, as the engine's worker had not.
    assert seen == {"amx": True, "before": False, "after": True, "again": True}
