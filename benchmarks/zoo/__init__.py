"""The model zoo: models nobody tuned the compiler for, each built from a config with random weights
(nothing is downloaded), in the families torch.compile is judged on. ``benchmarks/zoo/runner.py``
measures them: pass rate, speed-up over eager, compile time and peak memory, ours against Inductor.

A model is a :class:`ZooModel`: a name, a family, and ``build(device, dtype, size)`` returning a
:class:`Built` (the module, in eval mode, on ``device`` in ``dtype``; a function drawing fresh
inputs for it; the loss a training step takes of its output). ``size`` is ``"full"`` (the typical
batch sizes and lengths of the family, for timing) or ``"small"`` (a few layers and short
inputs, for CPU runs and CI). Builders import their libraries (transformers, torchvision, timm)
lazily; a model whose library is missing is reported as skipped with the reason, never dropped.

    from zoo import MODELS, select
    for model in select(families=["encoder"], device="cpu"):
        built = model.build("cpu", torch.float32, "small")
        out = built.module(*built.args(), **built.kwargs())
"""
from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

FAMILIES = ("decoder", "encoder", "encoder-decoder", "vision-transformer", "convnet", "mobile", "speech",
            "diffusion", "moe", "recurrent")


@attrs.frozen
class Built:
    """A built zoo model: ``module(*args(), **kwargs())`` is one inference call on fresh random
    inputs; ``loss(output)`` is the scalar a training step backpropagates."""

    module: torch.nn.Module
    make_inputs: Callable[[torch.Generator | None], tuple[tuple, dict]]
    loss: Callable[[Any], torch.Tensor]

    def inputs(self, seed: int = 0) -> tuple[tuple, dict]:
        """Fresh random inputs (positional, keyword), the same for the same seed."""
        generator = torch.Generator().manual_seed(seed)
        return self.make_inputs(generator)


@attrs.frozen
class ZooModel:
    """One model of the zoo. ``train``: it has a training-step row. ``cpu``: it runs in CPU zoo
    runs (and ``ci``: in the CI accuracy check, small and quick)."""

    name: str
    family: str
    build: Callable[[str, torch.dtype, str], Built]
    requires: tuple[str, ...] = ()
    train: bool = False
    cpu: bool = True
    ci: bool = False
    note: str = ""

    def missing(self) -> str | None:
        """Why this model cannot be built here (a library it needs does not import), or None."""
        import importlib
        for module in self.requires:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - any import failure means: skip, with the reason
                return f"{module} does not import: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return None


MODELS: dict[str, ZooModel] = {}


def register(name: str, family: str, *, requires: tuple[str, ...] = (), train: bool = False, cpu: bool = True,
             ci: bool = False, note: str = "") -> Callable:
    """Decorator registering ``build(device, dtype, size) -> Built`` as a zoo model."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")

    def add(build: Callable) -> Callable:
        if name in MODELS:
            raise ValueError(f"zoo model {name!r} is registered twice")
        MODELS[name] = ZooModel(name=name, family=family, build=build, requires=requires, train=train, cpu=cpu,
                                ci=ci, note=note)
        return build
    return add


def select(*, families: list[str] | None = None, names: list[str] | None = None, device: str = "cuda",
           train: bool | None = None, ci: bool = False) -> list[ZooModel]:
    """The models of the given families and names (all when None) that run on ``device``; with
    ``train``, only those with (True) or without (False) a training row; with ``ci``, the CI set."""
    load()
    unknown = sorted(set(names or []) - set(MODELS))
    if unknown:
        raise KeyError(f"no zoo model named {', '.join(unknown)}; models: {', '.join(sorted(MODELS))}")
    bad = sorted(set(families or []) - set(FAMILIES))
    if bad:
        raise KeyError(f"no zoo family named {', '.join(bad)}; families: {', '.join(FAMILIES)}")
    out = []
    for model in MODELS.values():
        if families and model.family not in families:
            continue
        if names and model.name not in names:
            continue
        if device == "cpu" and not model.cpu:
            continue
        if train is not None and model.train != train:
            continue
        if ci and not model.ci:
            continue
        out.append(model)
    return out


def load() -> None:
    """Import the modules that register the models (once)."""
    from . import language, other, vision  # noqa: F401


def random_ids(generator: torch.Generator | None, shape: tuple[int, ...], vocab: int, device: str) -> torch.Tensor:
    """Random token ids in ``[0, vocab)``."""
    return torch.randint(0, vocab, shape, generator=generator).to(device)


def padding_mask(generator: torch.Generator | None, batch: int, length: int, device: str) -> torch.Tensor:
    """An attention mask of ones, each row but the first padded at the end by a random amount
    (up to half its length): what a batch of sentences of different lengths looks like."""
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        pad = int(torch.randint(0, length // 2 + 1, (1,), generator=generator))
        if pad:
            mask[row, length - pad:] = 0
    return mask.to(device)


def randn(generator: torch.Generator | None, shape: tuple[int, ...], device: str, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal values drawn on the CPU (the same for a seed on every device), then moved."""
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)


def first_tensor(output: Any) -> torch.Tensor:
    """The tensor an output stands for: itself, a model output's first field (logits,
    last_hidden_state), or the first tensor of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        return first_tensor(next(iter(output.values())))
    if isinstance(output, (tuple, list)):
        return first_tensor(output[0])
    raise TypeError(f"cannot find a tensor in {type(output).__name__}")


def mean_square_loss(output: Any) -> torch.Tensor:
    """The generic training loss: the mean square of the output, in float32."""
    return first_tensor(output).float().square().mean()


__all__ = ["Built", "FAMILIES", "MODELS", "ZooModel", "first_tensor", "load", "mean_square_loss", "padding_mask",
           "randn", "random_ids", "register", "select"]
