"""The registry: plugin discovery through entry points, checked registration, plugin plans,
passes bound to plan instances, before/after-pass hooks and invariant checks.

The third-party plugin used here is a real distribution (``tests/plugins/pipeline_sample_plugin``)
installed by the ``sample_plugin`` fixture; small in-file plugins go through
:func:`pipeline.register_plugin` and are always unregistered again.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Any, Iterator

import attrs
import pytest
import torch
import torch.fx

import pipeline
from pipeline import get_registry

SAMPLE_DIST = "pipeline-sample-plugin"


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Compiled functions of one test never reuse Dynamo caches of another."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@contextlib.contextmanager
def registered(plugin: Any) -> Iterator[pipeline.registry.PluginInfo]:
    """Register ``plugin`` for the duration of a block; always unregister it."""
    try:
        yield pipeline.register_plugin(plugin)
    finally:
        pipeline.unregister_plugin(plugin)


def plugin_name(plugin: Any) -> str:
    """How errors name an in-file plugin object: its class's module and qualified name."""
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"


def square_plus_third(x: torch.Tensor) -> torch.Tensor:
    return x ** 2 + x / 3.0


def square_plus_double(x: torch.Tensor) -> torch.Tensor:
    return x ** 2 + x * 2


FAILING_PLAN = {"name": "fails", "passes": ["capture", "functionalize", "always-fails"]}


# -- discovery through the entry point ---------------------------------------------------------
def test_sample_plugin_passes_are_discovered_with_distribution_and_version(sample_plugin):
    registry = get_registry()
    for name in ("strength-reduce", "always-fails"):
        plugin = registry.passes[name].plugin
        assert (plugin.distribution, plugin.version, plugin.module) == (
            SAMPLE_DIST, "0.3.0", "pipeline_sample_plugin")
    assert registry.passes["dce"].plugin.distribution == "plan-pipeline"


def test_passes_cli_lists_plugin_pass_with_its_options(sample_plugin):
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_DISABLE_PLUGIN_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(sample_plugin.path)] + sys.path)
    result = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "passes"], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    block = result.stdout.split("strength-reduce  (", 1)[1].split("\n\n", 1)[0]
    assert f"from {SAMPLE_DIST} 0.3.0 (pipeline_sample_plugin)" in block
    assert "requires: functional" in block
    option_line = next(line for line in block.splitlines() if "enabled_ops:" in line)
    assert "list[pow | mul]" in option_line and "pow" in option_line.split("=", 1)[1]
    assert "Rewrites to apply" in block


# -- plans shipped by a plugin -----------------------------------------------------------------
def test_plugin_plan_is_found_by_file_stem(sample_plugin):
    entry = get_registry().plans["sample-strength"]
    assert entry.path.name == "sample-strength.yaml"
    assert entry.plugin.distribution == SAMPLE_DIST
    plan = pipeline.load_plan("sample-strength")
    names = plan.pass_names()
    assert names[names.index("functionalize") + 1] == "strength-reduce"
    assert plan.passes[names.index("strength-reduce")].options.enabled_ops == ["pow", "mul"]


def after_strength_reduce(record: Any) -> str:
    """The graph's code right after the plugin's pass (the plan fuses and compiles it later)."""
    return next(s["code"] for s in record.sources if s["stage"] == "strength-reduce")


def test_plugin_plan_rewrites_pow_to_mul_and_matches_eager(sample_plugin):
    compiled = pipeline.compile_with_plan(square_plus_third, "sample-strength", report=True)
    x = torch.randn(8, 16)
    torch.testing.assert_close(compiled(x), square_plus_third(x), rtol=0, atol=0)
    record = pipeline.compilation_of(compiled).graphs[0]
    rewritten = after_strength_reduce(record)
    assert "aten.mul" in rewritten
    assert "aten.pow" not in rewritten
    assert "aten.div.Tensor" in rewritten  # division is never rewritten
    assert {"pass": "strength-reduce", "topic": "passes",
            "message": "strength-reduce: rewrote 1 pow node(s)"} in record.notes


@pytest.mark.parametrize("fn, x, rewritten", [
    (lambda x: x ** 2, torch.arange(-3, 4), True),
    (lambda x: x ** 2.0, torch.arange(-3, 4), False),          # int ** float is a float tensor
    (lambda x: x * 2, torch.tensor([True, False]), False),     # bool * int is an int64 tensor
], ids=["int-pow-int", "int-pow-float", "bool-mul-int"])
def test_strength_reduce_never_changes_the_result_dtype(sample_plugin, fn, x, rewritten):
    compiled = pipeline.compile_with_plan(fn, "sample-strength")
    out, expected = compiled(x), fn(x)
    assert out.dtype == expected.dtype and torch.equal(out, expected)
    notes = pipeline.compilation_of(compiled).graphs[0].notes
    assert any(n["pass"] == "strength-reduce" for n in notes) == rewritten


@pytest.fixture
def autoload_off(sample_plugin, monkeypatch) -> Iterator[None]:
    monkeypatch.setenv("PIPELINE_DISABLE_PLUGIN_AUTOLOAD", "1")
    pipeline.reload_registry()
    yield
    monkeypatch.undo()
    pipeline.reload_registry()


def test_disabling_autoload_drops_plugin_passes_and_plans_but_keeps_builtins(autoload_off):
    registry = get_registry()
    assert "strength-reduce" not in registry.passes
    assert "always-fails" not in registry.passes
    assert "sample-strength" not in registry.plans
    assert {"capture", "functionalize", "dce"} <= set(registry.passes)
    assert "default" in registry.plans
    with pytest.raises(pipeline.PlanError, match="no plan named 'sample-strength'"):
        pipeline.load_plan("sample-strength")
    with pytest.raises(pipeline.PlanError, match="unknown pass 'strength-reduce'"):
        pipeline.load_plan({"name": "p", "passes": ["capture", "functionalize", "strength-reduce"]})


# -- failures name the pass and its plugin -------------------------------------------------------
def test_failing_plugin_pass_raises_pass_failure_naming_pass_and_distribution(sample_plugin):
    compiled = pipeline.compile_with_plan(square_plus_third, FAILING_PLAN)
    with pytest.raises(pipeline.PassFailure) as info:
        compiled(torch.randn(4))
    message = str(info.value)
    assert "'always-fails'" in message and SAMPLE_DIST in message and "boom" in message
    assert info.value.pass_name == "always-fails"
    assert SAMPLE_DIST in info.value.plugin


def test_failing_plugin_pass_falls_back_to_eager_when_plan_says_so(sample_plugin):
    compiled = pipeline.compile_with_plan(square_plus_third, FAILING_PLAN, on_error="eager")
    x = torch.randn(4)
    with pytest.warns(UserWarning, match="always-fails"):
        out = compiled(x)
    torch.testing.assert_close(out, square_plus_third(x))
    fallbacks = pipeline.compilation_of(compiled).summary()["fallbacks"]
    assert len(fallbacks) == 1
    assert "'always-fails'" in fallbacks[0]["reason"] and SAMPLE_DIST in fallbacks[0]["reason"]


# -- registration is checked ---------------------------------------------------------------------
@attrs.frozen
class LevelOptions:
    level: int = pipeline.option(1, "How hard to try.")


class IdentityPass(pipeline.Pass):
    """Returns its graph unchanged."""

    name = "registry-test-identity"
    Options = LevelOptions
    version = "1"

    def run(self, graph: torch.fx.GraphModule, context: pipeline.PassContext) -> torch.fx.GraphModule:
        return graph


def with_pass(pass_cls: Any) -> Any:
    """A plugin object whose pipeline_register_passes returns ``[pass_cls]``."""
    class PassesPlugin:
        @pipeline.hookimpl
        def pipeline_register_passes(self) -> list[type]:
            return [pass_cls]
    return PassesPlugin()


def pass_named(name: str) -> type:
    return type("NamedPass", (IdentityPass,), {"name": name})


def pass_with_options(options_cls: type) -> type:
    return type("OptionsPass", (IdentityPass,), {"Options": options_cls})


@attrs.define
class MutableOptions:
    level: int = pipeline.option(1, "How hard to try.")


@attrs.frozen
class UndocumentedOptions:
    level: int = 1


@attrs.frozen
class DefaultlessOptions:
    level: int = attrs.field(metadata={"doc": "How hard to try."})


@attrs.frozen
class BytesOptions:
    blob: bytes = pipeline.option(b"", "Raw bytes are not a plan value.")


class NotAPass:
    name = "registry-test-not-a-pass"

    def run(self, graph: Any, context: Any) -> Any:
        return graph


class RunlessPass(pipeline.Pass):
    name = "registry-test-runless"
    version = "1"


class NoHooks:
    def pipeline_register_passes(self) -> list[type]:  # not marked with @pipeline.hookimpl
        return [IdentityPass]


class MisspelledHook:
    @pipeline.hookimpl
    def pipeline_register_pass(self) -> list[type]:
        return [IdentityPass]


class ReturnsClassNotList:
    @pipeline.hookimpl
    def pipeline_register_passes(self) -> Any:
        return IdentityPass


class RaisesInRegister:
    @pipeline.hookimpl
    def pipeline_register_passes(self) -> list[type]:
        raise ValueError("kaput")


BAD_PLUGINS = {
    "name-not-kebab-case": (lambda: with_pass(pass_named("Registry_Test")), "kebab-case"),
    "options-not-frozen": (lambda: with_pass(pass_with_options(MutableOptions)), "is not frozen"),
    "option-without-doc": (lambda: with_pass(pass_with_options(UndocumentedOptions)),
                           "option 'level' has no doc"),
    "option-without-default": (lambda: with_pass(pass_with_options(DefaultlessOptions)),
                               "option 'level' has no default"),
    "unsupported-option-type": (lambda: with_pass(pass_with_options(BytesOptions)),
                                "option 'blob' has unsupported type"),
    "not-a-pass-subclass": (lambda: with_pass(NotAPass), "is not a subclass of pipeline.Pass"),
    "run-not-implemented": (lambda: with_pass(RunlessPass), "does not implement run()"),
    "no-hooks": (NoHooks, "implements no pipeline hooks"),
    "misspelled-hook": (MisspelledHook,
                        "unknown hook 'pipeline_register_pass'.*did you mean 'pipeline_register_passes'"),
    "hook-returns-non-list": (ReturnsClassNotList, "pipeline_register_passes must return a list, got type"),
    "hook-raises": (RaisesInRegister, "raised in pipeline_register_passes: ValueError: kaput"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLUGINS))
def test_invalid_plugin_is_rejected_naming_the_plugin_module(case):
    make, problem = BAD_PLUGINS[case]
    plugin = make()
    passes_before = set(get_registry().passes)
    try:
        with pytest.raises(pipeline.RegistrationError, match=problem) as info:
            pipeline.register_plugin(plugin)
    finally:
        pipeline.unregister_plugin(plugin)
    assert plugin_name(plugin) in str(info.value)
    assert set(get_registry().passes) == passes_before


def test_duplicate_pass_name_names_both_plugins(sample_plugin):
    plugin = with_pass(pass_named("strength-reduce"))
    try:
        with pytest.raises(pipeline.RegistrationError, match="'strength-reduce' is registered twice") as info:
            pipeline.register_plugin(plugin)
    finally:
        pipeline.unregister_plugin(plugin)
    assert f"{SAMPLE_DIST} 0.3.0 (pipeline_sample_plugin)" in str(info.value)
    assert plugin_name(plugin) in str(info.value)
    assert get_registry().passes["strength-reduce"].plugin.distribution == SAMPLE_DIST


def test_plugin_class_is_named_by_module_and_qualname():
    class StaticPlugin:
        @staticmethod
        @pipeline.hookimpl
        def pipeline_register_passes() -> list[type]:
            return [pass_named("Not_Kebab")]

    try:
        with pytest.raises(pipeline.RegistrationError) as info:
            pipeline.register_plugin(StaticPlugin)
    finally:
        pipeline.unregister_plugin(StaticPlugin)
    assert f"{StaticPlugin.__module__}.{StaticPlugin.__qualname__}" in str(info.value)


def test_registered_plugin_pass_is_usable_and_gone_after_unregister():
    plugin = with_pass(IdentityPass)
    with registered(plugin) as info:
        assert get_registry().passes["registry-test-identity"].plugin == info
        plan = pipeline.load_plan({"name": "p", "passes": ["capture", {"registry-test-identity": {"level": 3}}]})
        assert plan.passes[1].options == LevelOptions(level=3)
    assert "registry-test-identity" not in get_registry().passes


# -- passes bind to a plan instance --------------------------------------------------------------
def test_two_plans_with_different_options_of_one_pass_each_see_their_own(sample_plugin):
    pow_only = pipeline.load_plan("sample-strength", {"options": {"strength-reduce": {"enabled_ops": ["pow"]}}})
    mul_only = pipeline.load_plan("sample-strength", {"options": {"strength-reduce": {"enabled_ops": ["mul"]}}})
    a = pipeline.compile_with_plan(square_plus_double, pow_only, report=True)
    b = pipeline.compile_with_plan(square_plus_double, mul_only, report=True)
    x = torch.randn(8)
    for compiled in (a, b, a):
        torch.testing.assert_close(compiled(x), square_plus_double(x), rtol=0, atol=0)

    def bound(compiled: Any) -> pipeline.Pass:
        compilation = pipeline.compilation_of(compiled)
        return next(b.instance for b in compilation.graph_passes if b.name == "strength-reduce")

    assert bound(a).options.enabled_ops == ["pow"]
    assert bound(b).options.enabled_ops == ["mul"]
    assert bound(a) is not bound(b)
    instances_b = [p.instance for p in pipeline.compilation_of(b).graph_passes]
    assert not any(p.instance is q for p in pipeline.compilation_of(a).graph_passes for q in instances_b)
    code_a = after_strength_reduce(pipeline.compilation_of(a).graphs[0])
    code_b = after_strength_reduce(pipeline.compilation_of(b).graphs[0])
    assert "aten.pow" not in code_a and "aten.mul.Tensor(arg0_1, 2)" in code_a
    assert "aten.pow" in code_b and "aten.mul" not in code_b


# -- before/after-pass hooks ---------------------------------------------------------------------
class PassRecorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    @pipeline.hookimpl
    def pipeline_before_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        assert isinstance(graph, torch.fx.GraphModule) and context.current_pass == pass_.name
        self.events.append(("before", pass_.name, pass_))

    @pipeline.hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        assert isinstance(graph, torch.fx.GraphModule)
        self.events.append(("after", pass_.name, pass_))


def test_before_and_after_hooks_see_every_pass_in_plan_order(sample_plugin):
    recorder = PassRecorder()
    with registered(recorder):
        compiled = pipeline.compile_with_plan(square_plus_third, "sample-strength")
        compiled(torch.randn(4))
    compilation = pipeline.compilation_of(compiled)
    expected = []
    for bound in compilation.graph_passes:
        expected += [("before", bound.name, bound.instance), ("after", bound.name, bound.instance)]
    assert [(when, name) for when, name, _ in recorder.events] == [(w, n) for w, n, _ in expected]
    assert all(seen is instance for (_, _, seen), (_, _, instance) in zip(recorder.events, expected))
    assert [name for _, name, _ in recorder.events[::2]] == compilation.plan.pass_names()[1:]


class NamesOnly:
    """Declares only some of the hook's arguments, as pluggy allows."""

    def __init__(self) -> None:
        self.names: list[str] = []

    @pipeline.hookimpl
    def pipeline_before_pass(self, pass_: Any) -> None:
        self.names.append(pass_.name)


def test_hook_implementation_may_take_a_subset_of_the_arguments():
    recorder = NamesOnly()
    with registered(recorder):
        compiled = pipeline.compile_with_plan(square_plus_third, "default")
        compiled(torch.randn(4))
    assert recorder.names == pipeline.load_plan("default").pass_names()[1:]


class RaisesAfterPass:
    @pipeline.hookimpl
    def pipeline_after_pass(self, pass_: Any, graph: Any, context: Any) -> None:
        raise ValueError(f"cannot stand {pass_.name}")


def test_raising_after_pass_hook_is_a_pass_failure_naming_its_plugin():
    plugin = RaisesAfterPass()
    with registered(plugin):
        compiled = pipeline.compile_with_plan(square_plus_third, "default")
        with pytest.raises(pipeline.PassFailure) as info:
            compiled(torch.randn(4))
    message = str(info.value)
    assert plugin_name(plugin) in message
    assert "pipeline_after_pass" in message and "cannot stand functionalize" in message
    assert info.value.pass_name == "functionalize"


# -- invariant checks ----------------------------------------------------------------------------
class BrokenFunctionalCheck:
    @pipeline.hookimpl
    def pipeline_register_invariants(self) -> dict:
        return {"functional": lambda graph: "this check never accepts a graph"}


def test_failing_invariant_check_fails_a_verifying_plan_naming_the_check_plugin():
    plugin = BrokenFunctionalCheck()
    with registered(plugin):
        compiled = pipeline.compile_with_plan(square_plus_third, "default", verify="final")
        with pytest.raises(pipeline.PassFailure) as info:
            compiled(torch.randn(4))
    message = str(info.value)
    assert f"check from {plugin_name(plugin)}" in message
    assert "'functionalize'" in message and "this check never accepts a graph" in message


def test_invariant_checks_do_not_run_when_verify_is_off():
    with registered(BrokenFunctionalCheck()):
        compiled = pipeline.compile_with_plan(square_plus_third, "default", verify="off")
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), square_plus_third(x))


class CrashingCheck:
    @pipeline.hookimpl
    def pipeline_register_invariants(self) -> dict:
        def check(graph: torch.fx.GraphModule) -> str | None:
            raise KeyError("no such node")
        return {"functional": check}


def test_crashing_invariant_check_is_a_pass_failure_naming_its_plugin():
    plugin = CrashingCheck()
    with registered(plugin):
        compiled = pipeline.compile_with_plan(square_plus_third, "default", verify="final")
        with pytest.raises(pipeline.PassFailure) as info:
            compiled(torch.randn(4))
    assert plugin_name(plugin) in str(info.value) and "KeyError" in str(info.value)
