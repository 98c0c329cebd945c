"""The vLLM engine a run evaluates: launch, health watch, clean stop, injection receipts."""

from service.engine.launcher import Engine, EngineStartError, build_argv, build_env
from service.engine.process_group import ProcessGroupError

__all__ = ["Engine", "EngineStartError", "ProcessGroupError", "build_argv", "build_env"]
