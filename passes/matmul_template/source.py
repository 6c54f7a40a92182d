"""Triton source of the matmul template with a fused pointwise epilogue (pass ``matmul-template``).

One ``@triton.jit`` kernel computes ``out = epilogue(A @ B [+ bias])`` for a 2-D ``mm``,
``addmm`` or ``linear`` and the pointwise group that consumes its result: each program owns a
``[BLOCK_M, BLOCK_N]`` output tile (programs ordered in ``GROUP_M``-row bands, so neighbouring
programs share A and B tiles in L2), accumulates ``tl.dot`` products over ``BLOCK_K`` chunks of the
reduction in fp32, and then runs the epilogue on the accumulator tile before the one store.

The epilogue is written by the pointwise code generator itself (:class:`TemplateWriter` is a
:class:`~.triton_source.TritonWriter` whose addresses are the tile's row and column indices), so
every operator the Triton backend supports in a pointwise group is supported here, with the same
casts, NaN rules and fp16/bf16 rounding. The epilogue's other inputs (bias vectors, residual
matrices, scalars) are loaded with broadcasting by their strides over the ``[M, N]`` output.

The description the writer reads, :class:`TemplatePlan`, comes from a *combined group*: a
:class:`~passes.kernel_ir.groups.FusedGroup` whose subgraph is the matmul node followed by the epilogue's
nodes. Run eagerly it is the extern matmul plus the epilogue, which is what the template kernel
falls back to (and what verification compares against).
"""
from __future__ import annotations

import attrs
import torch
import torch.fx

from passes.kernel_ir.groups import FusedGroup, input_gather, input_padding, iota_of, meta_of, packet_name
from passes.kernel_ir.loops import Access, LoopNest, UnsupportedGroup

from passes.codegen.triton.ops import SIGNATURE_TYPES, helper_source, round_to
from passes.codegen.triton.blocks import Blocks, next_pow2
from passes.codegen.triton.source import HEADER, TritonSource, TritonWriter

MATMULS = ("aten.mm", "aten.addmm", "aten.linear")
# Operators that may sit between the matmul and its epilogue when they only reshape its contiguous
# [M, N] result to [..., N] (a 3-D linear's output view); the template then writes that shape.
RESHAPES = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten.as_strided")


@attrs.frozen
class TemplateConfig:
    """One launch configuration of the template: tile sizes, band height, warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    def describe(self) -> str:
        """``128x128x64 g8 w8 s3`` (tile M x N x K, band, warps, stages)."""
        return (f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} "
                f"s{self.num_stages}")


# Configurations tried for fp16/bf16 and for fp32 operands, best guess first (the first is the one
# `choose: always` uses). Tile shapes are the usual Hopper/Ampere Triton matmul set; fp32 tiles are
# smaller because fp32 operands take twice the shared memory per stage.
HALF_CONFIGS = [(128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4),
                (128, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4), (128, 128, 64, 8, 8, 3),
                (64, 256, 64, 8, 4, 4), (128, 64, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4), (128, 128, 32, 8, 4, 4),
                (64, 64, 64, 8, 4, 3), (64, 64, 32, 8, 4, 4)]
FP32_CONFIGS = [(128, 128, 32, 8, 8, 3), (64, 128, 32, 8, 4, 4), (128, 64, 32, 8, 4, 4),
                (64, 64, 32, 8, 4, 4), (64, 64, 16, 8, 4, 3), (32, 64, 32, 8, 4, 3)]


def candidate_configs(m: int, n: int, k: int, dtype: torch.dtype, limit: int) -> list[TemplateConfig]:
    """At most ``limit`` configurations for an ``[m, k] @ [k, n]`` product of ``dtype``: the
    table's tiles clipped to the problem (no tile dimension above the next power of two of its
    extent, none below 16, which ``tl.dot`` needs), duplicates dropped, warps capped at 4 for
    tiles under 64x64."""
    table = FP32_CONFIGS if dtype == torch.float32 else HALF_CONFIGS
    found: list[TemplateConfig] = []
    for bm, bn, bk, group, warps, stages in table:
        bm, bn, bk = (min(b, max(16, next_pow2(extent))) for b, extent in ((bm, m), (bn, n), (bk, k)))
        if bm * bn < 64 * 64:
            warps = min(warps, 4)
        config = TemplateConfig(bm, bn, bk, group, warps, stages)
        if config not in found:
            found.append(config)
    return found[:max(1, limit)]


def broadcast_strides(value: torch.Tensor, shape: tuple) -> tuple[int, ...]:
    """Element strides of ``value`` over the axes of ``shape`` when eager broadcasting reads it
    there (right-aligned, 0 along broadcast axes), as the loop analysis does for full-level reads."""
    offset = len(shape) - value.dim()
    if offset < 0:
        raise UnsupportedGroup(f"cannot broadcast {tuple(value.shape)} to {tuple(shape)}")
    out = [0] * len(shape)
    for axis, (size, stride) in enumerate(zip(value.shape, value.stride())):
        if size != 1:
            if size != shape[axis + offset]:
                raise UnsupportedGroup(f"{tuple(value.shape)} does not broadcast to {tuple(shape)}")
            out[axis + offset] = stride
    return tuple(out)


@attrs.frozen
class TemplatePlan:
    """What the template kernel of one combined group computes: the matmul node (and the reshape
    of its result the epilogue reads, if any), its operands as element strides (A over (m, k), B
    over (k, n), the bias over (m, n)), the problem size, the epilogue's nodes, and each epilogue
    input and output addressed over (m, n)."""

    group: FusedGroup
    matmul: torch.fx.Node
    view: torch.fx.Node | None
    a: torch.fx.Node
    b: torch.fx.Node
    a_strides: tuple[int, int]
    b_strides: tuple[int, int]
    bias: torch.fx.Node | None
    bias_strides: tuple[int, int] | None
    m: int
    n: int
    k: int
    dtype: torch.dtype
    nest: LoopNest

    @property
    def flops(self) -> int:
        """Multiply-adds times two: the matmul's floating-point operations."""
        return 2 * self.m * self.n * self.k


def _static(values) -> bool:
    return all(type(v) is int for v in values)


def merge_rows(strides: tuple, shape: tuple) -> tuple[int, int] | None:
    """Strides over (m, n) of an access with ``strides`` over ``shape`` = (..., n), where m walks
    all leading axes as one (row-major); None when the leading axes are not walked as one."""
    for axis in range(len(shape) - 2):
        if strides[axis] != strides[axis + 1] * shape[axis + 1]:
            return None
    return (strides[-2] if len(shape) > 1 else 0, strides[-1])


def _reshape_of(node: torch.fx.Node, matmul: torch.fx.Node) -> bool:
    """``node`` only reshapes the matmul's contiguous [M, N] result to a contiguous [..., N]."""
    if packet_name(node.target) not in RESHAPES or node.args[0] is not matmul:
        return False
    value, product = meta_of(node), meta_of(matmul)
    return (isinstance(value, torch.Tensor) and _static(value.shape) and value.dim() >= 2
            and value.shape[-1] == product.shape[1] and value.numel() == product.numel()
            and value.is_contiguous() and value.storage_offset() == 0 and product.is_contiguous())


def template_plan(group: FusedGroup) -> TemplatePlan:
    """The :class:`TemplatePlan` of a combined group (its first compute node is the matmul, then
    optionally a reshape of its result, then the pointwise epilogue); raises
    :class:`UnsupportedGroup` saying why it has none."""
    graph = group.subgraph.graph
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    if not nodes or packet_name(nodes[0].target) not in MATMULS:
        raise UnsupportedGroup("the group does not start with mm, addmm or linear")
    matmul, epilogue = nodes[0], nodes[1:]
    view = epilogue.pop(0) if epilogue and _reshape_of(epilogue[0], matmul) else None
    name = packet_name(matmul.target)
    if matmul.kwargs:
        raise UnsupportedGroup(f"{name} with keyword arguments (beta, alpha)")
    args = list(matmul.args)
    if name == "aten.addmm":
        bias, a, b = args
    else:
        a, b = args[:2]
        bias = args[2] if len(args) > 2 else None
    out, a_val, b_val = meta_of(matmul), meta_of(a), meta_of(b)
    for label, value in (("A", a_val), ("B", b_val), ("result", out)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise UnsupportedGroup(f"{name}: operand {label} is not a 2-D tensor")
        if not (_static(value.shape) and _static(value.stride())):
            raise UnsupportedGroup(f"{name}: operand {label} has dynamic shape or strides")
    if not (a_val.dtype == b_val.dtype == out.dtype):
        raise UnsupportedGroup(f"{name}: mixed dtypes {a_val.dtype}, {b_val.dtype} -> {out.dtype}")
    if out.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise UnsupportedGroup(f"{name} on {out.dtype} (the template takes fp16, bf16 and fp32)")
    m, k = a_val.shape
    n = out.shape[1]
    if name == "aten.linear":      # B is the transposed weight [n, k]
        b_strides = (b_val.stride(1), b_val.stride(0))
    else:
        b_strides = tuple(b_val.stride())
    if min(m, n, k) == 0:
        raise UnsupportedGroup(f"{name} with an empty operand")
    if 0 in a_val.stride() or 0 in b_strides:
        raise UnsupportedGroup(f"{name} of a broadcast (zero-stride) operand")
    shape = (m, n)
    domain = tuple(meta_of(view).shape) if view is not None else shape
    if tuple(group.domain) != domain or group.reduced:
        raise UnsupportedGroup(f"the epilogue's domain {list(group.domain)} is not the matmul's result {list(domain)}")

    def rows(strides: tuple, what: str) -> tuple[int, int]:
        merged = merge_rows(strides, domain)
        if merged is None:
            raise UnsupportedGroup(f"{what} is not addressed row-major over the leading axes of {list(domain)}")
        return merged

    bias_strides = None
    if bias is not None:
        bias_val = meta_of(bias)
        if not isinstance(bias_val, torch.Tensor) or bias_val.dtype != out.dtype:
            raise UnsupportedGroup(f"{name}: the bias is not a tensor of the result's dtype")
        bias_strides = broadcast_strides(bias_val, shape)
    loads: dict = {}
    for node in epilogue:
        if not isinstance(meta_of(node), torch.Tensor):
            raise UnsupportedGroup(f"{node.name} does not compute a tensor")
        if iota_of(node) is not None:
            raise UnsupportedGroup(f"{node.name} is an index ramp (the template has no loop indices for it)")
        if input_padding(node) is not None and node.args[0].op == "placeholder":
            raise UnsupportedGroup(f"{node.name} pads an input (the template has no loop indices for its mask)")
        if input_gather(node) is not None:
            raise UnsupportedGroup(f"{node.name} gathers an input (the template's epilogue has no indirect loads)")
        for arg in node.all_input_nodes:
            if arg.op != "placeholder":
                continue
            value = meta_of(arg)
            if not isinstance(value, torch.Tensor) or not (_static(value.shape) and _static(value.stride())):
                raise UnsupportedGroup(f"epilogue input {arg.name} is not a tensor of static shape")
            loads[(arg, node)] = Access(rows(broadcast_strides(value, domain), f"epilogue input {arg.name}"))
    outputs = []
    for node in next(n for n in graph.nodes if n.op == "output").args[0]:
        value = meta_of(node)
        if node not in epilogue:
            raise UnsupportedGroup(f"output {node.name} is not computed by the epilogue")
        if tuple(value.shape) != domain or not _static(value.stride()):
            raise UnsupportedGroup(f"output {node.name} has shape {list(value.shape)}, not the result's {list(domain)}")
        outputs.append((node, Access(rows(tuple(value.stride()), f"output {node.name}"))))
    nest = LoopNest(group=group, sizes=shape, reduced=(), nodes=epilogue, level={n: "full" for n in epilogue},
                    pass_of={n: 0 for n in epilogue}, loads=loads, outputs=outputs, passes=1)
    return TemplatePlan(group=group, matmul=matmul, view=view, a=a, b=b, a_strides=tuple(a_val.stride()), b_strides=b_strides,
                        bias=bias, bias_strides=bias_strides, m=m, n=n, k=k, dtype=out.dtype, nest=nest)


def _term(index: str, stride: int) -> str | None:
    if stride == 0:
        return None
    return index if stride == 1 else f"{index} * {stride}"


class TemplateWriter(TritonWriter):
    """Writes the template kernel of one :class:`TemplatePlan` and configuration. The epilogue
    runs through the pointwise writer: row indices ``rm`` (block dim ``x``) and column indices
    ``rn`` (block dim ``r``) address every load and store; the matmul node's value is the
    accumulator."""

    def __init__(self, plan: TemplatePlan, name: str, config: TemplateConfig, *, emulate_precision: bool,
                 allow_tf32: bool = False):
        self.plan = plan
        self.config = config
        self.allow_tf32 = allow_tf32
        programs = -(-plan.m // config.block_m) * -(-plan.n // config.block_n)
        super().__init__(plan.nest, name, emulate_precision=emulate_precision,
                         blocks=Blocks(False, config.block_m, config.block_n, programs, config.num_warps))
        reach = (plan.m - 1) * abs(plan.a_strides[0]) + (plan.k - 1) * abs(plan.a_strides[1])
        reach = max(reach, (plan.k - 1) * abs(plan.b_strides[0]) + (plan.n - 1) * abs(plan.b_strides[1]))
        self.int64 = self.int64 or reach >= 2 ** 31 - 1 - max(config.block_m, config.block_n, config.block_k)

    def offset(self, strides: tuple, level: str) -> tuple[str | None, frozenset]:
        terms = [t for t in (_term("rm", strides[0]), _term("rn", strides[1])) if t]
        if not terms:                   # one element for the whole tile: a column of it
            return "0 * rm", frozenset({"x"})
        dims = frozenset(({"x"} if strides[0] else set()) | ({"r"} if strides[1] else set()))
        return " + ".join(terms), dims

    def write(self) -> TritonSource:
        plan, config = self.plan, self.config
        placeholders = self.placeholders
        params = [f"in{i}" for i in range(len(placeholders))] + [f"out{j}" for j in range(len(self.nest.outputs))]
        consts = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                  "GROUP_M": config.group_m}
        self.emit(0, "@triton.jit")
        self.emit(0, f"def {self.name}({', '.join(params + [f'{c}: tl.constexpr' for c in consts])}):")
        self.write_mainloop()
        self.write_epilogue()
        signature = {f"in{i}": SIGNATURE_TYPES[meta_of(p).dtype] for i, p in enumerate(placeholders)}
        signature.update({f"out{j}": SIGNATURE_TYPES[meta_of(n).dtype] for j, (n, _) in enumerate(self.nest.outputs)})
        signature.update({c: "constexpr" for c in consts})
        ops = [packet_name(n.target).split(".")[-1] for n in self.nest.nodes]
        summary = (f"{self.name}: matmul template [{plan.m}, {plan.k}] @ [{plan.k}, {plan.n}] "
                   f"({packet_name(plan.matmul.target)}, {str(plan.dtype).removeprefix('torch.')}) with epilogue "
                   f"{ops}; grid ({self.blocks.grid},), {consts}, num_warps {config.num_warps}, "
                   f"num_stages {config.num_stages}")
        text = HEADER.format(summary=summary) + helper_source(self.uses) + "\n\n" + "\n".join(self.lines) + "\n"
        text += (f"\n\nKERNEL = {self.name}\nSIGNATURE = {signature!r}\nCONSTEXPRS = {consts!r}\n"
                 f"GRID = ({self.blocks.grid},)\nNUM_WARPS = {config.num_warps}\nNUM_STAGES = {config.num_stages}\n")
        return TritonSource(self.name, text, signature, consts, (self.blocks.grid,), config.num_warps, False)

    def write_mainloop(self) -> None:
        """Program id to tile (banded order), then the K loop accumulating in fp32."""
        plan = self.plan
        m, n, k = plan.m, plan.n, plan.k
        a_in, b_in = f"in{self.index[plan.a]}", f"in{self.index[plan.b]}"
        (sam, sak), (sbk, sbn) = plan.a_strides, plan.b_strides
        pid = "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"
        for line in (f"pid = {pid}",
                     f"num_pid_m = ({m} + BLOCK_M - 1) // BLOCK_M",
                     f"num_pid_n = ({n} + BLOCK_N - 1) // BLOCK_N",
                     "band = GROUP_M * num_pid_n",
                     "first_m = (pid // band) * GROUP_M",
                     "band_m = tl.minimum(num_pid_m - first_m, GROUP_M)",
                     "pid_m = first_m + (pid % band) % band_m",
                     "pid_n = (pid % band) // band_m",
                     "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
                     "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]",
                     "rk = tl.arange(0, BLOCK_K)"):
            self.emit(1, line)
        if m % self.config.block_m:
            self.xmask = "mask_m"
            self.emit(1, f"mask_m = rm < {m}")
        if n % self.config.block_n:
            self.rmask = "mask_n"
            self.emit(1, f"mask_n = rn < {n}")
        a_off = " + ".join(t for t in (_term("rm", sam), _term("rk[None, :]", sak)) if t) or "0 * rm"
        b_off = " + ".join(t for t in (_term("rk[:, None]", sbk), _term("rn", sbn)) if t) or "0 * rn"
        self.emit(1, f"a_ptrs = {a_in} + ({a_off})")
        self.emit(1, f"b_ptrs = {b_in} + ({b_off})")
        self.emit(1, "acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        ragged_k = k % self.config.block_k != 0
        self.emit(1, f"for k in range(0, {k}, BLOCK_K):")
        a_mask = [mk for mk in (self.xmask, f"(rk[None, :] < {k} - k)" if ragged_k else None) if mk]
        b_mask = [mk for mk in (f"(rk[:, None] < {k} - k)" if ragged_k else None, self.rmask) if mk]
        self.emit(2, "a = tl.load(a_ptrs" + (f", mask={' & '.join(a_mask)}, other=0.0)" if a_mask else ")"))
        self.emit(2, "b = tl.load(b_ptrs" + (f", mask={' & '.join(b_mask)}, other=0.0)" if b_mask else ")"))
        precision = ""
        if plan.dtype == torch.float32:
            precision = ", input_precision=" + ('"tf32"' if self.allow_tf32 else '"ieee"')
        self.emit(2, f"acc = tl.dot(a, b, acc{precision})")
        if sak:
            self.emit(2, f"a_ptrs += {_term('BLOCK_K', sak)}")
        if sbk:
            self.emit(2, f"b_ptrs += {_term('BLOCK_K', sbk)}")

    def write_epilogue(self) -> None:
        """The matmul's value (bias added, rounded to its dtype as the extern call's result is),
        then the epilogue's nodes on the tile, then the stores."""
        plan = self.plan
        value = "acc"
        if plan.bias is not None:
            bias, _ = self.load(1, plan.bias, plan.bias_strides, "full")
            value = f"acc + {bias}"
        if self.emulate:
            value = round_to(plan.dtype, value)
        var = f"v_{plan.matmul.name}"
        self.emit(1, f"{var} = {value}")
        self.var[plan.matmul], self.dims[plan.matmul] = var, frozenset({"x", "r"})
        if plan.view is not None:       # the same elements, the tile's rows spread over leading axes
            self.var[plan.view], self.dims[plan.view] = var, frozenset({"x", "r"})
        for node in self.nest.nodes:
            self.compute(1, node, "full")
        for node, access in self.nest.outputs:
            self.store(1, node, access.strides, "full")


def template_source(plan: TemplatePlan, name: str, config: TemplateConfig, *, emulate_precision: bool = True,
                    allow_tf32: bool = False) -> TritonSource:
    """The Triton module (one jitted kernel) of the template for ``plan`` with ``config``. fp32
    operands use exact (``ieee``) dot products unless ``allow_tf32`` (torch's
    ``allow_tf32`` setting for CUDA matmuls, which the extern call would follow)."""
    return TemplateWriter(plan, name, config, emulate_precision=emulate_precision, allow_tf32=allow_tf32).write()

