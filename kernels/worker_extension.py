"""The worker extension vLLM mixes into every worker of an engine that serves several arms.

The launcher starts such an engine with ``--worker-extension-cls
kernels.worker_extension.KernelSwitch``; the service then calls ``kvcanary_switch`` on every
worker through vLLM's ``collective_rpc`` (``POST /collective_rpc`` in the API server's dev mode),
whose HTTP route passes string arguments only: the request is one JSON object.
"""

from __future__ import annotations

import json
from typing import Any

SWITCH_METHOD = "kvcanary_switch"
DESCRIBE_METHOD = "kvcanary_describe"


class KernelSwitch:
    """Mixed into vLLM's worker class: its methods run in each worker process."""

    def kvcanary_switch(self, request: str) -> dict[str, Any]:
        """Switch this worker's kernels, canaries and receipt folder; returns what it did."""
        from kernels import vllm_plugin

        done = vllm_plugin.switch_this_process(json.loads(request))
        return {**done, "rank": getattr(self, "rank", None)}

    def kvcanary_describe(self) -> dict[str, Any]:
        """What the service needs before a switch: this worker's KV page size (its prefix-cache probe
        fills one whole page) and the switch generation it serves."""
        from kernels import vllm_plugin

        cache = getattr(self, "cache_config", None)
        return {
            "pid": vllm_plugin.current_pid(),
            "generation": vllm_plugin.current_generation(),
            "block_size": getattr(cache, "block_size", None),
        }
