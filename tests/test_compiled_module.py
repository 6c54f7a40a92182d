"""What users do with a compiled module besides calling it: copy it (an EMA copy), pickle it,
save it whole with ``torch.save``, and switch it between training and evaluation."""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import pipeline
from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(torch.relu(self.linear(x)))
        return torch.nn.functional.dropout(y, 0.5, training=self.training)    # the top module's own flag


def _roundtrip_pickle(module):
    return pickle.loads(pickle.dumps(module))


def _roundtrip_torch_save(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {"deepcopy": copy.deepcopy, "pickle": _roundtrip_pickle, "torch.save": _roundtrip_torch_save}


@pytest.mark.parametrize("called_first", [False, True])
@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_copy_of_a_compiled_module_is_a_working_compiled_module(how, called_first):
    model = Net().eval()
    compiled = compile_with_plan(model, "default")
    x = torch.randn(4, 8)
    if called_first:
        compiled(x)
    twin = COPIES[how](compiled)
    assert type(twin) is Net
    assert compilation_of(twin).plan.name == "default"
    with torch.no_grad():
        assert compare(model(x), twin(x)) is None
    assert compilation_of(twin).graphs, "the copy runs compiled graphs"


def test_a_deep_copy_owns_its_parameters():
    model = Net().eval()
    compiled = compile_with_plan(model, "default")
    ema = copy.deepcopy(compiled)
    with torch.no_grad():
        ema.linear.weight.mul_(0.5)
        x = torch.randn(4, 8)
        assert compare(model(x), compiled(x)) is None
        assert compare(model(x), ema(x)) is not None
        assert ema.linear.weight.data_ptr() != model.linear.weight.data_ptr()


def test_eval_and_train_on_the_compiled_module_switch_the_original_too():
    model = Net()
    compiled = compile_with_plan(model, "default")
    compiled.eval()
    assert (model.training, model.linear.training, compiled.training) == (False, False, False)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert compare(model(x), compiled(x)) is None           # no dropout in either
    assert compiled.train() is compiled
    assert (model.training, model.linear.training, compiled.training) == (True, True, True)


def test_the_compiled_module_keeps_its_state_dict_keys():
    model = Net()
    assert list(compile_with_plan(model, "default").state_dict()) == list(model.state_dict())
    assert list(copy.deepcopy(compile_with_plan(model, "default")).state_dict()) == list(model.state_dict())


def test_a_copy_keeps_the_plan_overrides():
    compiled = compile_with_plan(Net().eval(), "default", verify="final")
    twin = copy.deepcopy(compiled)
    assert pipeline.plan_of(twin).verify == "final"
