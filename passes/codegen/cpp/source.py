"""C++/OpenMP source for one fused group, from its loop nest.

Layout of a generated kernel: one parallel loop over the outer (kept) axes; for reductions, a
sequence of passes over the reduced axes (each pass recomputes the pointwise prologue it needs
from the loads and accumulates its reductions in fp32), outer-level epilogue code between passes,
and stores at the level each output lives on. The innermost loop carries ``#pragma omp simd``.
A nest with symbolic sizes takes their values as trailing ``int64_t`` arguments (``ks0``) and
spells loop bounds and strides as expressions of them.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from passes.kernel_ir import rules
from passes.kernel_ir.groups import CONSTANTS, REDUCTIONS, constant_value, input_gather, meta_of, packet_name
from passes.kernel_ir.loops import LoopNest, Ramp, closure
from passes.kernel_ir.symbolic import render, symbol_name

from .header import HEADER
from .ops import C_STORAGE, CppEmitter, compute_type, literal, load_expr, round_to, store_expr
from .pieces import Piece, open_bounds, pieces


# Below these sizes a parallel region costs more than it saves (waking the OpenMP team is tens of
# microseconds); reductions do more work per element, so they go parallel sooner.
PARALLEL_MIN_ELEMENTS = 131072
PARALLEL_MIN_REDUCED_ELEMENTS = 32768
ROW_CACHE_MAX = 16384        # longest row (reduced elements) kept in per-thread buffers
ROW_CACHE_BUFFERS = 4


def _expensive(node: torch.fx.Node, full: set) -> bool:
    """Worth caching: recomputing it would evaluate a transcendental function again."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if rules.transcendental(packet_name(current.target)):
            return True
        stack.extend(a for a in current.all_input_nodes if a in full)
    return False


def ramp_expr(ramp: Ramp, ctype: str) -> str:
    """An index ramp's value at the current loop point (``i<axis>`` is that axis's index)."""
    if ramp.axis is None:
        return literal(ramp.start, ctype)
    index = f"i{ramp.axis}"
    if ramp.step != 1:
        index = f"INT64_C({ramp.step}) * {index}"
    if ramp.start != 0:
        index = f"INT64_C({ramp.start}) + {index}"
    return f"(({ctype})({index}))"


def c_size(size) -> str:
    """A size or stride (an int or a symbolic :class:`~passes.kernel_ir.symbolic.Dim`) in C."""
    return render(size, "c")


def later_roots_of(later: list) -> set:
    return {root for _, _, roots in later for root in roots}


class KernelWriter:
    """Writes one ``extern "C"`` function for a loop nest."""

    def __init__(self, nest: LoopNest, name: str, *, emulate_precision: bool):
        self.nest = nest
        self.name = name
        self.emulate = emulate_precision
        self.lines: list[str] = []
        self.placeholders = [n for n in nest.group.subgraph.graph.nodes if n.op == "placeholder"]
        self.index = {p: i for i, p in enumerate(self.placeholders)}
        self.var: dict = {}
        self.cached_in: dict = {}    # node -> row buffer it is read from in the current pass
        self.cache_out: dict = {}    # node -> row buffer it is written to in the current pass
        self.inverted = {n.args[1] for n in self.reciprocal_candidates()}
        self.piece: Piece | None = None     # the range of the nest being written (pieces.py)
        self.reciprocal_divs = set(self.reciprocal_candidates())

    # -- helpers -----------------------------------------------------------------------------
    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def ctype(self, node: torch.fx.Node) -> str:
        return compute_type(meta_of(node).dtype)

    def offset(self, strides: tuple[int, ...], level: str, shift: int = 0) -> str:
        terms = [f"INT64_C({shift})"] if shift else []
        for axis, stride in enumerate(strides):
            if stride == 0:
                continue
            if level == "outer" and axis in self.nest.reduced:
                continue
            terms.append(f"i{axis}" if stride == 1 else f"i{axis} * {c_size(stride)}")
        return " + ".join(terms) or "0"

    def operand(self, consumer: torch.fx.Node, level: str):
        def render(arg: Any, ctype: str) -> str:
            if isinstance(arg, torch.fx.Node):
                if arg.op == "placeholder":
                    access = self.nest.loads[(arg, consumer)]
                    value = load_expr(f"in{self.index[arg]}", self.offset(access.strides, level, access.shift),
                                      meta_of(arg).dtype)
                    bounds = access.bounds if self.piece is None else open_bounds(access.bounds, self.piece.ranges)
                    fill = literal(access.fill, compute_type(meta_of(arg).dtype))
                    if bounds is None:      # a padded input outside its source in this piece
                        value = fill
                    elif bounds:            # a padded input: the source's elements, the fill elsewhere
                        inside = " && ".join(f"i{a} >= {lo} && i{a} < {hi}" for a, lo, hi in bounds)
                        value = f"(({inside}) ? {value} : {fill})"
                else:
                    value = self.var[arg]
                return value if compute_type(meta_of(arg).dtype) == ctype else f"(({ctype}){value})"
            return literal(arg, ctype)
        return render

    def decided(self, node: torch.fx.Node) -> str | None:
        """In a piece: the expression of a comparison it decides, or of a select whose condition
        it decides (the branch taken); None otherwise."""
        known = self.piece.known if self.piece is not None else {}
        if node in known:
            return "true" if known[node] else "false"
        if packet_name(node.target) == "aten.where" and node.args[0] in known:
            return self.operand(node, "full")(node.args[1] if known[node.args[0]] else node.args[2], self.ctype(node))
        return None

    def compute(self, depth: int, node: torch.fx.Node, level: str) -> None:
        ct = self.ctype(node)
        if (expr := self.decided(node)) is not None:
            self.var[node] = var = f"v_{node.name}"
            self.emit(depth, f"const {ct} {var} = {expr};")
            self.after_value(depth, node)
            return
        if node in self.cached_in:
            var = f"v_{node.name}"
            self.emit(depth, f"const {ct} {var} = {self.cached_in[node]}[r];")
            self.var[node] = var
            return
        if node in self.nest.ramps:
            expr = ramp_expr(self.nest.ramps[node], ct)
        elif packet_name(node.target) in CONSTANTS:
            expr = literal(constant_value(node), ct)
        elif input_gather(node) is not None:    # an indirect load at the index's value
            source, index = node.args[0], node.args[2]
            access = self.nest.loads[(source, node)]
            row = self.operand(node, level)(index, "int64_t")
            expr = load_expr(f"in{self.index[source]}", f"{self.offset(access.strides, level)} + ({row}) * "
                             f"{c_size(access.gather)}", meta_of(source).dtype)
            if compute_type(meta_of(source).dtype) != ct:
                expr = f"(({ct}){expr})"
        elif node in self.reciprocal_divs:      # (never in half precision with emulation: no rounding)
            divisor = node.args[1]
            numerator = self.operand(node, level)(node.args[0], ct)
            expr = f"({numerator} * inv_{divisor.name})"
        else:       # an operator: its rule, rounded as the rule says
            expr = rules.render(node, CppEmitter(self.operand(node, level), self.emulate))
        var = f"v_{node.name}"
        self.emit(depth, f"const {ct} {var} = {expr};")
        self.var[node] = var
        self.after_value(depth, node)

    def after_value(self, depth: int, node: torch.fx.Node) -> None:
        """Extra work right after a value exists: its reciprocal, or caching it in a row buffer."""
        if node in self.inverted:
            ct = self.ctype(node)
            self.emit(depth, f"const {ct} inv_{node.name} = ({ct})1 / v_{node.name};")
        if node in self.cache_out:
            self.emit(depth, f"{self.cache_out[node]}[r] = v_{node.name};")

    def decompose(self, depth: int, flat: str, axes: list[int]) -> None:
        """Index variables i<axis> of ``axes`` from a flat row-major index."""
        sizes = self.nest.sizes
        for position, axis in enumerate(axes):
            inner = math.prod(sizes[a] for a in axes[position + 1:])
            expr = flat if len(axes) == 1 else (f"{flat} / {c_size(inner)}" if position == 0 else
                                                f"({flat} / {c_size(inner)}) % {c_size(sizes[axis])}")
            if position == len(axes) - 1 and len(axes) > 1:
                expr = f"{flat} % {c_size(sizes[axis])}"
            self.emit(depth, f"const int64_t i{axis} = {expr};")

    def store(self, depth: int, node: torch.fx.Node, strides: tuple[int, ...], level: str) -> None:
        k = [n for n, _ in self.nest.outputs].index(node)
        dtype = meta_of(node).dtype
        self.emit(depth, f"out{k}[{self.offset(strides, level)}] = {store_expr(self.var[node], dtype)};")

    def reciprocal_candidates(self) -> list[torch.fx.Node]:
        """Full-level divisions by a reduced value: multiply by its reciprocal, computed once per row."""
        nest = self.nest
        out = []
        for node in nest.nodes:
            if packet_name(node.target) not in ("aten.div", "prims.div") or nest.level[node] != "full":
                continue
            divisor = node.args[1]
            if (isinstance(divisor, torch.fx.Node) and nest.level.get(divisor) == "outer"
                    and self.ctype(node) in ("float", "double") and self.ctype(divisor) == self.ctype(node)
                    and not (self.emulate and meta_of(node).dtype in (torch.float16, torch.bfloat16))):
                out.append(node)
        return out

    # -- the kernel --------------------------------------------------------------------------
    def write(self) -> str:
        params = [f"const {C_STORAGE[meta_of(p).dtype]}* __restrict__ in{i}"
                  for i, p in enumerate(self.placeholders)]
        params += [f"{C_STORAGE[meta_of(n).dtype]}* __restrict__ out{k}"
                   for k, (n, _) in enumerate(self.nest.outputs)]
        if self.nest.decisions is not None:     # symbolic sizes: their values are arguments
            params += [f"const int64_t {symbol_name(s)}" for s in self.nest.decisions.symbols]
        self.emit(0, f'extern "C" void {self.name}({", ".join(params)}) {{')
        if self.nest.group.reduced or any(packet_name(n.target) in REDUCTIONS for n in self.nest.nodes):
            self.write_reduction()
        else:
            self.write_pointwise()
        self.emit(0, "}")
        return "\n".join(self.lines)

    def write_pointwise(self) -> None:
        nest = self.nest
        sizes = nest.sizes
        total = math.prod(sizes)
        parallel = total >= PARALLEL_MIN_ELEMENTS
        split = pieces(nest) if nest.decisions is None else None
        last = len(sizes) - 1
        if len(sizes) <= 1:
            pragma = "#pragma omp parallel for simd schedule(static)" if parallel else "#pragma omp simd"
            self.inner_loops(1, 0, sizes[0] if sizes else 1, pragma, split or [None])
            return
        outer_axes = list(range(last))
        if parallel:
            self.emit(1, "#pragma omp parallel for schedule(static)")
        self.emit(1, f"for (int64_t o = 0; o < {c_size(math.prod(sizes[:-1]))}; ++o) {{")
        self.decompose(2, "o", outer_axes)
        if split is None:
            self.inner_loops(2, last, sizes[last], "#pragma omp simd", [None])
        else:       # one branch per range of the outer axes, one loop per range of the last
            branches: dict = {}
            for piece in split:
                key = tuple((a, r) for a, r in sorted(piece.ranges.items()) if a != last)
                branches.setdefault(key, []).append(piece)
            several = len(branches) > 1
            for k, (key, group) in enumerate(branches.items()):
                test = " && ".join(f"i{a} >= {lo} && i{a} < {hi}" for a, (lo, hi) in key)
                if several:
                    self.emit(2, f"if ({test}) {{" if k == 0 else "} else {" if k == len(branches) - 1
                              else f"}} else if ({test}) {{")
                self.inner_loops(3 if several else 2, last, sizes[last], "#pragma omp simd", group)
            if several:
                self.emit(2, "}")
        self.emit(1, "}")

    def inner_loops(self, depth: int, axis: int, size, pragma: str, split: list) -> None:
        """The innermost loop over ``axis``: once over its whole range, or once per piece of
        ``split`` (each over its range of the axis, computing what that piece needs)."""
        for piece in split:
            lo, hi = piece.ranges.get(axis, (0, size)) if piece is not None else (0, size)
            self.piece = piece
            saved = dict(self.var)
            self.emit(depth, pragma)
            self.emit(depth, f"for (int64_t i{axis} = {lo}; i{axis} < {c_size(hi)}; ++i{axis}) {{")
            self.body_pointwise(depth + 1)
            self.emit(depth, "}")
            self.var = saved
        self.piece = None

    def body_pointwise(self, depth: int) -> None:
        live = self.piece.live if self.piece is not None else None
        for node in self.nest.nodes:
            if live is None or node in live:
                self.compute(depth, node, "full")
        for node, access in self.nest.outputs:
            self.store(depth, node, access.strides, "full")

    def write_reduction(self) -> None:
        nest = self.nest
        outer = nest.outer_axes
        red = list(nest.reduced)
        outer_total = math.prod(nest.sizes[a] for a in outer)
        red_total = math.prod(nest.sizes[a] for a in red)
        if outer_total * red_total >= PARALLEL_MIN_REDUCED_ELEMENTS and outer_total > 1:
            self.emit(1, "#pragma omp parallel for schedule(static)")
        self.emit(1, f"for (int64_t o = 0; o < {c_size(outer_total)}; ++o) {{")
        if outer:
            self.decompose(2, "o", outer)
        full_nodes = [n for n in nest.nodes if nest.level[n] == "full"]
        reductions = [n for n in nest.nodes if packet_name(n.target) in REDUCTIONS]
        outer_nodes = [n for n in nest.nodes if nest.level[n] == "outer" and n not in reductions]
        outputs = dict(nest.outputs)
        plan = self.pass_plan(full_nodes, reductions, outputs, red_total)
        in_outputs = self.buffers_in_outputs(plan, red)
        for buffer, ct in plan["buffers"]:
            if buffer in in_outputs:
                strides = outputs[in_outputs[buffer]].strides
                self.emit(2, f"{ct}* const {buffer} = out{self.output_index(in_outputs[buffer])} + "
                             f"({self.offset(strides, 'outer')});")
            else:
                # A symbolic row is at most ROW_CACHE_MAX long (pass_plan decided so): a buffer
                # of that length serves every size of the class.
                self.emit(2, f"{ct} {buffer}[{red_total if isinstance(red_total, int) else ROW_CACHE_MAX}];")
        for p in range(nest.passes + 1):
            for node in outer_nodes:
                if nest.pass_of[node] == p:
                    self.outer_value(2, node)
            if p == nest.passes:
                break
            these, stores, needed = plan["passes"][p]
            if not these and not stores:
                continue
            self.cached_in = plan["reads"][p]
            self.cache_out = plan["writes"][p]
            for r in these:
                self.init_reduction(2, r)
            depth = self.open_reduced_loops(2, red, red_total, self.simd_pragma(these))
            saved = dict(self.var)
            for node in needed:
                self.compute(depth, node, "full")
            for r in these:
                self.update_reduction(depth, r)
            for node in stores:
                self.store(depth, node, outputs[node].strides, "full")
            self.var = saved
            self.cached_in, self.cache_out = {}, {}
            for level in range(depth - 1, 1, -1):
                self.emit(level, "}")
            for r in these:
                self.finish_reduction(2, r)
        for node, access in nest.outputs:
            if nest.level[node] == "outer":
                self.store(2, node, access.strides, "outer")
        self.emit(1, "}")

    def open_reduced_loops(self, depth: int, red: list, red_total, pragma: str) -> int:
        """Open the loops of one pass over the reduced axes; returns the depth of their body, which
        sees ``r`` (the flat reduced index: row buffers, argmax) and ``i<axis>`` of each reduced axis.

        One reduced loop axis: one loop over ``r``. Several (reduced axes the layout cannot merge,
        a batch norm's (N, H, W) around its channels): one loop per axis, the innermost under
        ``pragma``, so no element pays a division to find its indices and the innermost loop
        walks its axis with a constant stride."""
        if len(red) <= 1:
            if pragma:
                self.emit(depth, pragma)
            self.emit(depth, f"for (int64_t r = 0; r < {c_size(red_total)}; ++r) {{")
            if red:
                self.decompose(depth + 1, "r", red)
            return depth + 1
        sizes = self.nest.sizes
        flat = "INT64_C(0)"
        for k, axis in enumerate(red):
            if k == len(red) - 1 and pragma:
                self.emit(depth + k, pragma)
            self.emit(depth + k, f"for (int64_t i{axis} = 0; i{axis} < {c_size(sizes[axis])}; ++i{axis}) {{")
            flat = f"({flat} * {c_size(sizes[axis])} + i{axis})"
        body = depth + len(red)
        self.emit(body, f"const int64_t r = {flat};")
        return body

    def pass_plan(self, full_nodes: list, reductions: list, outputs: dict, red_total: int) -> dict:
        """What each pass computes, and which expensive values computed in one pass are kept in a
        per-row buffer for later passes instead of being recomputed (rows up to ROW_CACHE_MAX)."""
        nest = self.nest
        roots = []
        for p in range(nest.passes):
            these = [r for r in reductions if nest.pass_of[r] == p + 1]
            stores = [n for n in full_nodes if n in outputs and nest.pass_of[n] == p]
            roots.append((these, stores, [r.args[0] for r in these] + stores))
        cached: dict = {}
        plan: dict = {"passes": [], "reads": [], "writes": [], "buffers": []}
        for p, (these, stores, pass_roots) in enumerate(roots):
            needed = closure(pass_roots, full_nodes, frozenset(cached))
            reads = {n: cached[n] for n in needed if n in cached}
            writes = {}
            if red_total <= ROW_CACHE_MAX:
                later = set()
                for _, _, later_roots in roots[p + 1:]:
                    later |= set(closure(later_roots, full_nodes, frozenset(cached)))
                for node in needed:
                    if node in cached or node not in later or len(plan["buffers"]) >= ROW_CACHE_BUFFERS:
                        continue
                    if not _expensive(node, set(full_nodes)):
                        continue
                    if any(u in later and u not in needed for u in node.users) or node in later_roots_of(roots[p + 1:]):
                        buffer = f"row_{node.name}"
                        cached[node] = buffer
                        writes[node] = buffer
                        plan["buffers"].append((buffer, self.ctype(node)))
            plan["passes"].append((these, stores, needed))
            plan["reads"].append(reads)
            plan["writes"].append(writes)
        plan["passes"].append(([], [], []))
        plan["reads"].append({})
        plan["writes"].append({})
        return plan

    def buffers_in_outputs(self, plan: dict, red: list) -> dict:
        """Row buffers that can live in an output's row instead of on the stack: ``{buffer: output
        node}``. Softmax keeps its exponentials in the output row, which the last pass then scales
        in place (one row fewer in cache: benchmarks/results/cpu-2026-11-30-a.md). Allowed when
        the output is stored in the last pass only, holds the buffer's C type, lays out the reduced
        axes as one dense row in loop order (so ``row[r]`` is the element the last pass stores at
        ``r``, after reading it), and no pass after the buffer is written loads an input (which
        the output may share memory with when the kernel runs in place)."""
        nest = self.nest
        last = nest.passes - 1
        dense, size = [], 1
        for axis in reversed(red):
            dense.append((axis, size))
            size *= nest.sizes[axis]
        chosen: dict = {}
        for p, writes in enumerate(plan["writes"]):
            for node, buffer in writes.items():
                if any(self.loads_inputs(plan, later) for later in range(p + 1, nest.passes)):
                    continue
                ct = self.ctype(node)
                for out, access in nest.outputs:
                    if (out in chosen.values() or nest.level[out] != "full" or nest.pass_of[out] != last
                            or C_STORAGE[meta_of(out).dtype] != ct
                            or any(access.strides[axis] != step for axis, step in dense)):
                        continue
                    chosen[buffer] = out
                    break
        return chosen

    def loads_inputs(self, plan: dict, p: int) -> bool:
        """Whether pass ``p`` loads any input (values it reads from row buffers do not count)."""
        _, _, needed = plan["passes"][p]
        reads = plan["reads"][p]
        return any(arg.op == "placeholder" for node in needed if node not in reads for arg in node.all_input_nodes)

    def output_index(self, node: torch.fx.Node) -> int:
        return [n for n, _ in self.nest.outputs].index(node)

    def outer_value(self, depth: int, node: torch.fx.Node) -> None:
        self.compute(depth, node, "outer")

    # -- reductions --------------------------------------------------------------------------
    def init_reduction(self, depth: int, node: torch.fx.Node) -> None:
        name = packet_name(node.target)
        src_ct = compute_type(meta_of(node.args[0]).dtype)
        acc = f"acc_{node.name}"
        if name in ("aten.sum", "prims.sum"):
            self.emit(depth, f"{self.ctype(node)} {acc} = 0;")
        elif name == "aten.prod":
            self.emit(depth, f"{self.ctype(node)} {acc} = 1;")
        elif name in ("aten.amax", "aten.amin"):
            if src_ct in ("float", "double"):
                sign = "-" if name == "aten.amax" else ""
                self.emit(depth, f"{src_ct} {acc} = {sign}std::numeric_limits<{src_ct}>::infinity();")
            else:
                init = "lowest()" if name == "aten.amax" else "max()"
                self.emit(depth, f"{src_ct} {acc} = std::numeric_limits<{src_ct}>::{init};")
            self.emit(depth, f"int64_t nan_{node.name} = 0;")
        else:  # argmax / argmin
            self.emit(depth, f"{src_ct} best_{node.name} = 0; int64_t {acc} = -1;")

    def simd_pragma(self, reductions: list[torch.fx.Node]) -> str:
        clauses = []
        for node in reductions:
            name = packet_name(node.target)
            acc = f"acc_{node.name}"
            if name in ("aten.argmax", "aten.argmin"):
                return ""
            if name in ("aten.sum", "prims.sum"):
                clauses.append(f"reduction(+:{acc})")
            elif name == "aten.prod":
                clauses.append(f"reduction(*:{acc})")
            else:
                clauses.append(f"reduction({'max' if name == 'aten.amax' else 'min'}:{acc}) "
                               f"reduction(+:nan_{node.name})")
        return "#pragma omp simd " + " ".join(clauses)

    def update_reduction(self, depth: int, node: torch.fx.Node) -> None:
        name = packet_name(node.target)
        src = node.args[0]
        src_ct = compute_type(meta_of(src).dtype)
        value = self.operand(node, "full")(src, src_ct)
        acc = f"acc_{node.name}"
        if name in ("aten.sum", "prims.sum"):
            self.emit(depth, f"{acc} += ({self.ctype(node)}){value};")
        elif name == "aten.prod":
            self.emit(depth, f"{acc} *= ({self.ctype(node)}){value};")
        elif name in ("aten.amax", "aten.amin"):
            op = ">" if name == "aten.amax" else "<"
            self.emit(depth, f"{{ const {src_ct} x = {value}; {acc} = x {op} {acc} ? x : {acc};"
                             + (f" nan_{node.name} += (x != x); }}" if src_ct in ("float", "double") else " }"))
        else:
            op = ">" if name == "aten.argmax" else "<"
            nan = " || (x != x && best_{0} == best_{0})".format(node.name) if src_ct in ("float", "double") else ""
            self.emit(depth, f"{{ const {src_ct} x = {value}; if ({acc} < 0 || ((x {op} best_{node.name}"
                             f" && best_{node.name} == best_{node.name}){nan})) {{ best_{node.name} = x; {acc} = r; }} }}")

    def finish_reduction(self, depth: int, node: torch.fx.Node) -> None:
        name = packet_name(node.target)
        acc = f"acc_{node.name}"
        ct = self.ctype(node)
        var = f"v_{node.name}"
        if name in ("aten.amax", "aten.amin"):
            src_ct = compute_type(meta_of(node.args[0]).dtype)
            if src_ct in ("float", "double"):
                self.emit(depth, f"if (nan_{node.name}) {acc} = NAN;")
            self.emit(depth, f"const {ct} {var} = ({ct}){acc};")
        elif name in ("aten.argmax", "aten.argmin"):
            self.emit(depth, f"const int64_t {var} = {acc} < 0 ? 0 : {acc};")
        else:
            expr = f"({ct}){acc}"
            if self.emulate:
                expr = round_to(meta_of(node).dtype, expr)
            self.emit(depth, f"const {ct} {var} = {expr};")
        self.var[node] = var
        self.after_value(depth, node)


def kernel_source(nest: LoopNest, name: str, *, emulate_precision: bool = True) -> str:
    """The C++ function for one loop nest."""
    return KernelWriter(nest, name, emulate_precision=emulate_precision).write()


def module_source(functions: list[str]) -> str:
    return HEADER + "\n" + "\n\n".join(functions) + "\n"
