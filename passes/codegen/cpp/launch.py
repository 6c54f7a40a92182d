"""Launch functions of C++ kernels, written per call site of the generated host code.

:meth:`CppKernel.__call__ <passes.codegen.CppKernel.__call__>` serves every call: it checks the
inputs' layouts in loops, picks each output's buffer (handed over, donated by an input, or
allocated), then calls the library function. At a call site of the host code all of that but the
checks is known in advance: which outputs take a dying input's buffer (``donors``), and the layout
and dtype of every output. :func:`launcher` writes that site's function as straight-line Python::

    def cpp_fused_3(a0, a1):
        if a0.stride() != S0 or a1.stride() != S1 or a0.dtype is not D0 ... : return eager(a0, a1)
        o0 = empty(SH0, ST0, DT0)
        fn(a0.data_ptr(), a1.data_ptr(), o0.data_ptr(), a1.data_ptr())    # output 1 into a1
        return (o0, a1)

with the same results as the kernel's own call and less host work per launch (the per-launch
cost that decides small models' speed on the CPU).
"""
from __future__ import annotations

from typing import Any, Callable

from pipeline import compat


def launcher(kernel: Any, donors: tuple = ()) -> Callable:
    """The launch function of ``kernel`` (a :class:`~passes.codegen.CppKernel` of static layouts,
    or a size-class kernel at particular sizes, whose size arguments it passes as constants;
    without output pads) at a call site passing ``donors`` (per output, the input whose buffer it
    takes, -1 to allocate). Inputs that are not the layouts, dtypes or device the kernel was
    generated for run the group eagerly, as the kernel's own call does."""
    inputs = [f"a{i}" for i in range(len(kernel.in_strides))]
    namespace: dict[str, Any] = {"fn": kernel.function, "eager": kernel.group, "empty": compat.empty_strided_cpu()}
    checks = []
    for i, (value, stride, dtype) in enumerate(zip(inputs, kernel.in_strides, kernel.in_dtypes)):
        namespace[f"S{i}"], namespace[f"D{i}"] = tuple(stride), dtype
        checks += [f"{value}.stride() != S{i}", f"{value}.dtype is not D{i}", f"not {value}.is_cpu"]
    arguments = ", ".join(inputs)
    name = kernel.__name__       # the host code reads as calls of the kernels themselves
    lines = [f"def {name}({arguments}):"]
    if checks:
        lines.append(f"    if {' or '.join(checks)}:")
        lines.append(f"        return eager({arguments})")
    outputs = []
    for k, (shape, stride, dtype) in enumerate(kernel.outputs):
        donor = donors[k] if donors else -1
        if donor >= 0:
            outputs.append(inputs[donor])
            continue
        namespace[f"SH{k}"], namespace[f"ST{k}"], namespace[f"DT{k}"] = tuple(shape), tuple(stride), dtype
        lines.append(f"    o{k} = empty(SH{k}, ST{k}, DT{k})")
        outputs.append(f"o{k}")
    arguments = [f"{value}.data_ptr()" for value in inputs + outputs] + [str(int(v)) for v in kernel.size_args]
    lines.append(f"    fn({', '.join(arguments)})")
    lines.append(f"    return ({', '.join(outputs)},)")
    exec(compile("\n".join(lines) + "\n", f"<launch {name}>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace[name]
