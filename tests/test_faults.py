"""Faults during a compile end in the plan's policy, and never leave a half-written cache entry.

``on_error: raise`` turns each fault into one clear error naming what failed; ``on_error: eager``
runs the graph eagerly and records the reason in the compilation record. The faults: a plugin
raising in each hook, a pass raising, generated C++ or Triton source that does not compile, a
cache folder that is read-only, full or blocked by a file, a compiler killed mid-build, and a
compile interrupted with Ctrl-C (which always propagates: an interrupt is not a compile error).
"""
from __future__ import annotations

import errno
import os
import signal
import stat
import warnings
from pathlib import Path

import attrs
import pytest
import torch

import pipeline
from pipeline import PassFailure, RegistrationError, compilation_of, compile_with_plan, hookimpl
from pipeline.errors import PipelineError

os.environ.setdefault("TRITON_INTERPRET", "1")   # as in test_triton_backend: before triton is imported


def model(x):
    return torch.relu(x) * 2.0 + 1.0


X = torch.linspace(-3, 3, 64).reshape(8, 8)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_with(policy: str, cache: Path, **overrides):
    return compile_with_plan(model, "default", on_error=policy, cache={"dir": str(cache)}, **overrides)


def run_eager_policy(compiled) -> str:
    """Call a compiled function whose compile fails under ``on_error: eager``: it must give eager's
    result, warn, and record the reason; returns the recorded reason."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(X.clone())
    torch.testing.assert_close(out, model(X))
    record = compilation_of(compiled).graphs[0]
    assert record.fallback, "on_error: eager recorded no reason"
    assert any("runs eagerly" in str(w.message) for w in caught)
    assert record.kernels == 0
    return record.fallback


def assert_cache_complete(cache: Path) -> None:
    """Only complete entries: no temporary file, no library; a source file is whole."""
    folder = cache / "cpp"
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    libraries = {n for n in names if n.endswith(".so")}
    leftovers = [n for n in names if not n.startswith("k_") or n.endswith((".tmp", ".so"))
                 or (n.endswith(".sha256") and n[:-len(".sha256")] in libraries)]
    assert not leftovers, f"half-written or temporary files left in the cache: {leftovers}"
    for name in names:
        if name.endswith(".sha256"):      # a library's digest, written just before the library
            continue
        text = (folder / name).read_text()
        assert text.startswith("// Generated") and text.endswith("}\n"), f"{name} is not a whole source file"


def assert_cache_works_again(cache: Path) -> None:
    torch._dynamo.reset()
    compiled = compiled_with("raise", cache)
    torch.testing.assert_close(compiled(X.clone()), model(X))
    assert compilation_of(compiled).graphs[0].kernels == 1
    assert list((cache / "cpp").glob("k_*.so"))


# -- plugins raising in every hook -------------------------------------------------------------------
class RaisingPlugin:
    """Raises in one hook; ``pass_name`` limits the instrumentation hooks to one pass."""

    def __init__(self, hook: str, pass_name: str = "fuse"):
        self.hook = hook
        self.pass_name = pass_name

    def fail(self):
        raise RuntimeError(f"injected fault in {self.hook}")

    @hookimpl
    def pipeline_register_passes(self):
        return self.fail() if self.hook == "pipeline_register_passes" else []

    @hookimpl
    def pipeline_register_plans(self):
        return self.fail() if self.hook == "pipeline_register_plans" else []

    @hookimpl
    def pipeline_register_invariants(self):
        if self.hook == "pipeline_register_invariants":
            self.fail()
        if self.hook == "invariant-check":
            return {"fused": lambda gm: self.fail()}
        return {}

    @hookimpl
    def pipeline_before_pass(self, pass_, graph, context):
        if self.hook == "pipeline_before_pass" and pass_.name == self.pass_name:
            self.fail()

    @hookimpl
    def pipeline_after_pass(self, pass_, graph, context):
        if self.hook == "pipeline_after_pass" and pass_.name == self.pass_name:
            self.fail()


@pytest.fixture
def plugin():
    registered = []

    def register(obj):
        pipeline.register_plugin(obj)
        registered.append(obj)
        return obj

    yield register
    for obj in registered:
        pipeline.unregister_plugin(obj)


@pytest.mark.parametrize("hook", ["pipeline_register_passes", "pipeline_register_plans",
                                  "pipeline_register_invariants"])
def test_a_plugin_raising_while_registering_is_a_registration_error_naming_it(hook):
    with pytest.raises(RegistrationError) as info:
        pipeline.register_plugin(RaisingPlugin(hook))
    message = str(info.value)
    assert "RaisingPlugin" in message and hook in message and "injected fault" in message
    assert not any(isinstance(p.obj, RaisingPlugin) for p in pipeline.get_registry().plugins)


@pytest.mark.parametrize("hook", ["pipeline_before_pass", "pipeline_after_pass"])
@pytest.mark.parametrize("pass_name", ["functionalize", "codegen"])
def test_a_plugin_raising_around_a_pass_under_on_error_raise_names_plugin_hook_and_pass(
        plugin, tmp_path, hook, pass_name):
    plugin(RaisingPlugin(hook, pass_name))
    with pytest.raises(PassFailure) as info:
        compiled_with("raise", tmp_path)(X.clone())
    message = str(info.value)
    assert "RaisingPlugin" in message and hook in message and f"'{pass_name}'" in message
    assert info.value.pass_name == pass_name


@pytest.mark.parametrize("hook", ["pipeline_before_pass", "pipeline_after_pass"])
def test_a_plugin_raising_around_a_pass_under_on_error_eager_runs_eagerly_with_the_reason(
        plugin, tmp_path, hook):
    plugin(RaisingPlugin(hook, "fuse"))
    reason = run_eager_policy(compiled_with("eager", tmp_path))
    assert hook in reason and "injected fault" in reason and "RaisingPlugin" in reason


@pytest.mark.parametrize("policy", ["raise", "eager"])
def test_an_invariant_check_that_raises_ends_in_the_policy(plugin, tmp_path, policy):
    plugin(RaisingPlugin("invariant-check"))
    compiled = compiled_with(policy, tmp_path, verify="final")
    if policy == "raise":
        with pytest.raises(PassFailure, match="invariant check for 'fused'.*injected fault"):
            compiled(X.clone())
    else:
        assert "invariant check for 'fused'" in run_eager_policy(compiled)


class ExplodingPass(pipeline.Pass):
    """A third-party pass whose run() raises."""

    name = "exploding"
    version = "1"
    requires = frozenset({"functional"})

    def run(self, graph, context):
        raise ZeroDivisionError("injected fault in a pass")


class ExplodingPlugin:
    @hookimpl
    def pipeline_register_passes(self):
        return [ExplodingPass]


@pytest.mark.parametrize("policy", ["raise", "eager"])
def test_a_pass_that_raises_ends_in_the_policy(plugin, tmp_path, policy):
    plugin(ExplodingPlugin())
    compiled = compiled_with(policy, tmp_path, passes=["capture", "functionalize", "exploding"])
    if policy == "raise":
        with pytest.raises(PassFailure, match="pass 'exploding'.*ZeroDivisionError: injected fault"):
            compiled(X.clone())
    else:
        assert "ZeroDivisionError: injected fault in a pass" in run_eager_policy(compiled)


# -- generated source that does not compile ----------------------------------------------------------
@pytest.fixture
def broken_cpp(monkeypatch):
    from passes.codegen.cpp import source as cpp_source
    monkeypatch.setattr(cpp_source, "HEADER", cpp_source.HEADER + "#error injected fault: not C++\n")


def test_generated_cpp_that_does_not_compile_raises_naming_the_source(broken_cpp, tmp_path):
    from passes.codegen.cpp.build import CompileError
    with pytest.raises(CompileError) as info:
        compiled_with("raise", tmp_path)(X.clone())
    assert "injected fault: not C++" in str(info.value) and str(tmp_path / "cpp") in str(info.value)
    assert_cache_complete(tmp_path)


def test_generated_cpp_that_does_not_compile_runs_eagerly_under_on_error_eager(broken_cpp, tmp_path):
    assert "injected fault: not C++" in run_eager_policy(compiled_with("eager", tmp_path))
    assert_cache_complete(tmp_path)


@pytest.fixture
def broken_triton(monkeypatch):
    pytest.importorskip("triton")
    from passes.codegen.triton import runtime as triton_runtime
    if not triton_runtime.interpreting() or triton_runtime.interpreter_problem():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set in this process")
    from passes.codegen.triton import generate as triton_generate
    original = triton_generate.kernel_source

    def broken(*args, **kwargs):
        generated = original(*args, **kwargs)
        return attrs.evolve(generated, source=generated.source.replace("def ", "def def ", 1))

    monkeypatch.setattr(triton_generate, "kernel_source", broken)


TRITON = {"options": {"codegen": {"backend": "triton"}}}


def test_generated_triton_that_does_not_compile_raises_naming_codegen(broken_triton, tmp_path):
    with pytest.raises(PassFailure) as info:
        compiled_with("raise", tmp_path, **TRITON)(X.clone())
    assert info.value.pass_name == "codegen" and "SyntaxError" in str(info.value)


def test_generated_triton_that_does_not_compile_runs_eagerly_under_on_error_eager(broken_triton, tmp_path):
    assert "SyntaxError" in run_eager_policy(compiled_with("eager", tmp_path, **TRITON))


# -- the cache folder: read-only, full, blocked ------------------------------------------------------
@pytest.fixture
def refuse_writes(monkeypatch):
    """Make the filesystem refuse to create files and folders under a path with ``errno`` (works
    as root too, where permission bits would not stop the writes)."""
    def install(folder: Path, code: int):
        real_open, real_mkdir = os.open, os.mkdir
        prefix = str(folder)

        def guarded_open(path, flags, mode=0o777, *, dir_fd=None):
            if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR) and os.fspath(path).startswith(prefix):
                raise OSError(code, os.strerror(code), os.fspath(path))
            return real_open(path, flags, mode, dir_fd=dir_fd)

        def guarded_mkdir(path, mode=0o777, *, dir_fd=None):
            if os.fspath(path).startswith(prefix):
                raise OSError(code, os.strerror(code), os.fspath(path))
            return real_mkdir(path, mode, dir_fd=dir_fd)

        monkeypatch.setattr(os, "open", guarded_open)
        monkeypatch.setattr(os, "mkdir", guarded_mkdir)
    return install


CACHE_FAULTS = {
    "read-only folder": (errno.EROFS, "Read-only file system", True),
    "read-only root not yet created": (errno.EROFS, "cannot create the kernel cache folder", False),
    "full disk": (errno.ENOSPC, "No space left on device", True),
}


def assert_built_privately(compiled, cache: Path, text: str) -> None:
    """The call works, with one warning naming the cache folder, the reason and the private folder."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(X.clone())
    torch.testing.assert_close(out, model(X))
    assert compilation_of(compiled).graphs[0].kernels == 1
    messages = [str(w.message) for w in caught if "private temporary folder" in str(w.message)]
    assert len(messages) == 1, [str(w.message) for w in caught]
    assert text in messages[0] and str(cache) in messages[0] and "cache.dir" in messages[0]


@pytest.fixture(autouse=True)
def _warn_again():
    from passes.codegen.cpp import build as cpp_build
    cpp_build._warned.clear()           # each test sees its own cache problem's warning


@pytest.mark.parametrize("fault", sorted(CACHE_FAULTS))
@pytest.mark.parametrize("policy", ["raise", "eager"])
def test_an_unwritable_cache_builds_kernels_in_a_private_folder_with_one_warning(refuse_writes, tmp_path,
                                                                                 fault, policy):
    code, text, exists = CACHE_FAULTS[fault]
    cache = tmp_path / "cache"
    if exists:
        (cache / "cpp").mkdir(parents=True)
    refuse_writes(cache, code)
    assert_built_privately(compiled_with(policy, cache), cache, text)
    assert not cache.exists() or not any(cache.rglob("*.so"))


def test_a_file_where_the_cache_folder_should_be_degrades_to_a_private_folder(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    assert_built_privately(compiled_with("raise", blocker), blocker, "cannot create the kernel cache folder")


def test_a_file_where_the_kernel_folder_should_be_degrades_to_a_private_folder(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "cpp").write_text("not a folder")
    assert_built_privately(compiled_with("raise", cache), cache, "cannot create the kernel cache folder")


def test_a_folder_where_a_kernel_library_should_be_degrades_to_a_private_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "0")
    cache = tmp_path / "cache"
    compiled_with("raise", cache)(X.clone())
    (library,) = (cache / "cpp").glob("k_*.so")
    library.unlink()
    library.mkdir()
    from passes.codegen.cpp import build as cpp_build
    cpp_build._loaded.clear()
    torch._dynamo.reset()
    assert_built_privately(compiled_with("raise", cache), cache, "a folder is in the way")


REMOVING_COMPILER = """#!/bin/sh
if [ "$1" != "--version" ] && [ ! -e {marker} ]; then touch {marker}; rm -rf {cache}; fi
exec {real} "$@"
"""


def test_a_cache_folder_removed_while_the_compiler_runs_is_made_again(tmp_path, monkeypatch):
    import shutil
    cache = tmp_path / "cache"
    script = tmp_path / "removing-g++"
    script.write_text(REMOVING_COMPILER.format(marker=tmp_path / "removed", cache=cache,
                                               real=shutil.which("g++")))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(script))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled_with("raise", cache)(X.clone())
    torch.testing.assert_close(out, model(X))
    assert (tmp_path / "removed").exists(), "the compiler did remove the cache folder"
    assert list((cache / "cpp").glob("k_*.so")), "the kernel is in the cache folder, made again"
    assert not [w for w in caught if "private temporary folder" in str(w.message)]


def test_an_unwritable_cache_does_not_matter_with_the_cache_disabled(refuse_writes, tmp_path):
    cache = tmp_path / "cache"
    refuse_writes(cache, errno.EROFS)
    compiled = compile_with_plan(model, "default", cache={"dir": str(cache), "enabled": False})
    torch.testing.assert_close(compiled(X.clone()), model(X))
    assert compilation_of(compiled).graphs[0].kernels == 1


# -- a compiler that dies, fills the disk, or is interrupted -----------------------------------------
FAKE_COMPILER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake-g++ 1.0 {mode}"; exit 0; fi
out=""; prev=""
for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done
head -c 4096 /dev/urandom > "$out"          # a half-written library
case "{mode}" in
  full) echo "fatal error: error writing to $out: No space left on device" >&2; exit 1;;
  killed) kill -KILL $$;;
  interrupt) kill -INT $PPID; sleep 30; exit 1;;
esac
"""


@pytest.fixture
def fake_compiler(monkeypatch, tmp_path):
    def install(mode: str) -> Path:
        script = tmp_path / f"fake-g++-{mode}"
        script.write_text(FAKE_COMPILER.format(mode=mode))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("CXX", str(script))
        return script
    return install


@pytest.mark.parametrize("mode, text", [("full", "No space left on device"), ("killed", "killed by signal 9")])
@pytest.mark.parametrize("policy", ["raise", "eager"])
def test_a_compiler_that_fails_midway_leaves_no_library_in_the_cache(fake_compiler, monkeypatch, tmp_path,
                                                                     mode, text, policy):
    fake_compiler(mode)
    cache = tmp_path / "cache"
    compiled = compiled_with(policy, cache)
    if policy == "raise":
        with pytest.raises(PipelineError, match=text):
            compiled(X.clone())
    else:
        assert text in run_eager_policy(compiled)
    assert_cache_complete(cache)
    monkeypatch.delenv("CXX")
    assert_cache_works_again(cache)


@pytest.mark.parametrize("policy", ["raise", "eager"])
def test_an_interrupted_compile_propagates_and_leaves_no_library_in_the_cache(fake_compiler, monkeypatch,
                                                                              tmp_path, policy, request):
    fake_compiler("interrupt")
    # A process started in the background by a non-interactive shell inherits SIGINT ignored,
    # and Python then never raises KeyboardInterrupt: give this test Python's usual handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        compiled_with(policy, cache)(X.clone())
    assert_cache_complete(cache)
    monkeypatch.delenv("CXX")
    assert_cache_works_again(cache)


def test_a_truncated_library_in_the_cache_is_rebuilt(tmp_path):
    from passes.codegen.cpp import build as cpp_build
    source = '// Generated\nextern "C" int answer_for_truncation_test(void) { return 42; }\n'
    folder = cpp_build.cache_dir(str(tmp_path))
    damaged = folder / f"k_{cpp_build.cache_key(source)}.so"
    damaged.write_bytes(b"\x7fELF" + bytes(60))          # what a crash mid-copy could leave
    library, _, hit = cpp_build.build(source, directory=str(tmp_path))
    assert not hit and library.answer_for_truncation_test() == 42
    assert damaged.stat().st_size > 64


# -- damaged kernel files are never loaded -----------------------------------------------------------

def _flip_constant(path: Path, value: float) -> int:
    """Flip one high mantissa bit in every float32 copy of ``value`` in a file (how a bit flip on
    disk changes a kernel's constant); returns how many copies changed."""
    import struct
    pattern = struct.pack("<f", value)
    data = bytearray(path.read_bytes())
    changed = bytearray(pattern)
    changed[2] ^= 0x10
    count = data.count(pattern)
    damaged = path.with_suffix(".damaged")
    damaged.write_bytes(bytes(data).replace(pattern, bytes(changed)))
    os.replace(damaged, path)          # a new file: a library this process mapped stays intact
    return count


def test_a_library_whose_constant_flipped_is_rebuilt_not_loaded(tmp_path):
    from passes.codegen.cpp import build as cpp_build
    source = '// Generated\nextern "C" float half_sqrt2_for_damage_test(void) { return 0.70710678f; }\n'
    library, _, hit = cpp_build.build(source, directory=str(tmp_path))
    path = cpp_build.cache_dir(str(tmp_path)) / f"k_{cpp_build.cache_key(source)}.so"
    assert _flip_constant(path, 0.70710678) >= 1
    cpp_build._loaded.clear()                                    # as in a later process
    with pytest.warns(UserWarning, match="does not match the SHA-256 recorded when it was built"):
        library, _, hit = cpp_build.build(source, directory=str(tmp_path))
    import ctypes
    library.half_sqrt2_for_damage_test.restype = ctypes.c_float
    assert not hit and abs(library.half_sqrt2_for_damage_test() - 0.70710678) < 1e-7


def test_a_damaged_kernel_library_never_gives_a_wrong_answer_without_a_graph_entry(tmp_path, monkeypatch):
    """The graph cache is off, so nothing but the kernel cache stands between the damaged
    library and the call; a later compile rebuilds it and matches eager."""
    from passes.codegen.cpp import build as cpp_build
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "0")

    def gelu(x):
        return torch.nn.functional.gelu(x) * 2

    x = torch.randn(64, 64)
    compile_with_plan(gelu, "default", cache={"dir": str(tmp_path)})(x)
    (library,) = (tmp_path / "cpp").glob("k_*.so")
    assert _flip_constant(library, 0.7071067811865476) >= 1
    cpp_build._loaded.clear()
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="removed and rebuilt"):
        out = compile_with_plan(gelu, "default", cache={"dir": str(tmp_path)})(x)
    torch.testing.assert_close(out, gelu(x))


def test_a_damaged_triton_module_file_is_replaced_before_it_is_imported(tmp_path):
    from passes.codegen.triton import runtime as triton_runtime
    text = "# generated\nVALUE = 0.70710678\n"
    path, hit = triton_runtime.write_source(text, str(tmp_path))
    assert not hit
    path.write_text(text.replace("0.70710678", "0.70710688"))
    with pytest.warns(UserWarning, match="does not hold the source"):
        again, hit = triton_runtime.write_source(text, str(tmp_path))
    assert again == path and not hit and path.read_text() == text


def test_temporary_files_a_killed_build_left_behind_are_cleaned_once_stale(tmp_path):
    from passes.codegen.cpp import build as cpp_build
    folder = tmp_path / "cache" / "cpp"
    folder.mkdir(parents=True)
    stale, fresh = folder / "tmpabc123.so", folder / "tmpdef456.so"
    for path in (stale, fresh):
        path.write_bytes(b"half a library")
    old = os.path.getmtime(stale) - 2 * cpp_build.STALE_SECONDS
    os.utime(stale, (old, old))
    cpp_build.cache_dir(str(tmp_path / "cache"))
    assert not stale.exists() and fresh.exists()      # a build in progress elsewhere keeps its file
