"""A plan-driven compiler for PyTorch.

    from pipeline import compile_with_plan
    model = compile_with_plan(model, "plans/llm-serving.yaml")   # or a plan name, a dict, a Plan

The engine in this package knows no pass by name: every pass, built-in or third-party, is registered
through pluggy (``pipeline_register_passes``) and composed by a YAML plan.

Seeing inside a compile (docs/observability.md): ``PIPELINE_LOGS`` topic logs, :func:`compile_report`
and ``PIPELINE_REPORT_DIR`` (JSON + HTML), :func:`explain`, plan ``expect:``, reproducers written
under ``verify: each`` (``pipeline repro``) and :func:`bisect` (``pipeline bisect``).
"""
import importlib
import importlib.abc
import importlib.util
import sys

from pipeline.errors import (ExpectationError, GraphBreakError, PassFailure, PipelineError, PlanError,
                             RecompileError, RegistrationError, ShapeError, VerificationError)
from pipeline.graph_pass import (CaptureContext, CapturePass, Fuel, GraphCompiler, JointGraph, Pass, PassContext,
                                 SplitPass)
from pipeline.hooks import hookimpl, hookspec
from pipeline.options import NoOptions, device_types, non_negative, option, positive
from pipeline.plan.schema import CacheSettings, Expectations, PassSpec, Plan, PlanWarning, load_plan
from pipeline.registry import get_registry, register_plugin, reload_registry, unregister_plugin
from pipeline.api import compilation_of, compile_with_plan, plan_of
from pipeline.metrics import Metric, Outcome
from pipeline.serving import stance, warmup
from pipeline.plan.shapes import ShapeSettings
from pipeline.logs import configure_from_env as _configure_logs, get_logger, set_logs
from pipeline.tools.report import compile_report, write_report
from pipeline.tools.explain import Explanation, explain
from pipeline.tools.bisect import BisectResult, bisect
from pipeline.tools.tune import TuneResult, tune
from pipeline.tools.profile import Profile, profile
from pipeline.cache.artifacts import ArtifactError, describe_artifacts, load_artifacts, save_artifacts

_configure_logs()   # PIPELINE_LOGS

# Modules that moved keep working under their old import paths (``pipeline.graph_cache`` is
# ``pipeline.cache.graphs``): the old name is the same module object, imported on first use.
MOVED_MODULES = {
    "pipeline.plan_text": "pipeline.plan.text", "pipeline.yamlio": "pipeline.plan.yamlio",
    "pipeline.shapes": "pipeline.plan.shapes", "pipeline.compat_dynamo": "pipeline.compat.dynamo",
    "pipeline.graph_cache": "pipeline.cache.graphs", "pipeline.graph_io": "pipeline.cache.graph_io",
    "pipeline.artifacts": "pipeline.cache.artifacts",
    **{f"pipeline.{name}": f"pipeline.tools.{name}"
       for name in ("cli", "report", "report_html", "explain", "bisect", "minimize", "repro", "docgen", "demo")},
    "pipeline.fused": "passes.kernel_ir.groups", "pipeline.loops": "passes.kernel_ir.loops",
    "pipeline.graph_contents": "passes.kernel_ir.contents",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(MOVED_MODULES[spec.name])
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())

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
    "Metric", "Outcome",
    "tune", "TuneResult", "profile", "Profile",
    "save_artifacts", "load_artifacts", "describe_artifacts", "ArtifactError",
]
