"""The built-in passes. This package is a plugin like any third-party one: it is declared in the
``pipeline.plugins`` entry-point group of this project's ``pyproject.toml`` and registers its passes,
plans and invariant checks through the same hooks."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch.fx

from pipeline import compat, hookimpl

from .capture import Capture
from .codegen import SIZES_METRIC, Codegen
from .constant_fold import ConstantFold
from .kernel_ir.metrics import METRICS as KERNEL_METRICS
from .matmul_template import MatmulTemplate
from .cse import CommonSubexpressionElimination
from .dce import DeadCodeElimination
from .decompose import Decompose, core_aten_check
from .functionalize import Functionalize, mutated_intermediates
from .pad_mm import PadMatmul
from .channels_last import ChannelsLast
from .pack_weights import PackWeights
from .transpose_weights import TransposeWeights
from .fuse import Fuse
from .reinplace import Reinplace
from .cudagraphs import METRIC as CUDAGRAPHS_METRIC, CudaGraphs
from .partition import Partition

BUILTIN_PASSES = [Capture, Functionalize, Decompose, DeadCodeElimination,
                  CommonSubexpressionElimination, ConstantFold, PadMatmul, ChannelsLast, Fuse, PackWeights, TransposeWeights, Reinplace, Codegen, MatmulTemplate, CudaGraphs,
                  Partition]


@hookimpl
def pipeline_register_passes() -> list[type]:
    return list(BUILTIN_PASSES)


@hookimpl
def pipeline_register_metrics() -> list:
    return [*KERNEL_METRICS, CUDAGRAPHS_METRIC, SIZES_METRIC]


@hookimpl
def pipeline_register_plans() -> list[str]:
    # The plans folder sits next to this package, in a source tree and when installed alike. It is
    # found by path, not imported, so a user's own `plans/` folder cannot shadow it.
    here = Path(__file__).resolve().parent.parent / "plans"
    return [str(here)] if here.is_dir() else [str(resources.files("plans"))]


def functional_check(gm: torch.fx.GraphModule) -> str | None:
    """Invariant 'functional': the only in-place ops are write-backs into graph inputs."""
    left = mutated_intermediates(gm)
    if left:
        return f"node {left[0].name} ({compat.op_name(left[0].target)}) mutates an intermediate value"
    return None


@hookimpl
def pipeline_register_invariants() -> dict:
    return {"functional": functional_check, "core-aten": core_aten_check}
