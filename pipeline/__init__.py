"""A plan-driven compiler for PyTorch.

    from pipeline import compile_with_plan
    model = compile_with_plan(model, "plans/llm-serving.yaml")   # or a plan name, a dict, a Plan

The engine in this package knows no pass by name: every pass, built-in or third-party, is registered
through pluggy (``pipeline_register_passes``) and composed by a YAML plan.

Seeing inside a compile (docs/observability.md): ``PIPELINE_LOGS`` topic logs, :func:`compile_report`
and ``PIPELINE_REPORT_DIR`` (JSON + HTML), :func:`explain`, plan ``expect:``, reproducers written
under ``verify: each`` (``pipeline repro``) and :func:`bisect` (``pipeline bisect``).
"""
from .errors import (ExpectationError, GraphBreakError, PassFailure, PipelineError, PlanError,
                     RecompileError, RegistrationError, ShapeError, VerificationError)
from .graph_pass import (CaptureContext, CapturePass, Fuel, GraphCompiler, JointGraph, Pass, PassContext,
                         SplitPass)
from .hooks import hookimpl, hookspec
from .options import NoOptions, device_types, non_negative, option, positive
from .plan import CacheSettings, Expectations, PassSpec, Plan, PlanWarning, load_plan
from .registry import get_registry, register_plugin, reload_registry, unregister_plugin
from .api import compilation_of, compile_with_plan, plan_of
from .serving import stance, warmup
from .shapes import ShapeSettings
from .logs import configure_from_env as _configure_logs, get_logger, set_logs
from .report import compile_report, write_report
from .explain import Explanation, explain
from .bisect import BisectResult, bisect
from .artifacts import ArtifactError, describe_artifacts, load_artifacts, save_artifacts

_configure_logs()   # PIPELINE_LOGS

__all__ = [
    "compile_with_plan", "compilation_of", "plan_of", "load_plan",
    "Plan", "PassSpec", "CacheSettings", "Expectations",
    "Pass", "CapturePass", "SplitPass", "JointGraph", "PassContext", "CaptureContext", "GraphCompiler",
    "hookimpl", "hookspec", "option", "positive", "non_negative", "device_types", "NoOptions",
    "get_registry", "reload_registry", "register_plugin", "unregister_plugin",
    "PipelineError", "PlanError", "PlanWarning", "RegistrationError", "PassFailure", "VerificationError",
    "GraphBreakError", "RecompileError", "ExpectationError", "ShapeError",
    "warmup", "stance", "ShapeSettings",
    "explain", "Explanation", "compile_report", "write_report", "bisect", "BisectResult", "Fuel",
    "get_logger", "set_logs",
    "save_artifacts", "load_artifacts", "describe_artifacts", "ArtifactError",
]
