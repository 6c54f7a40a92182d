"""Hostile plans never produce a traceback.

Hypothesis writes plan files that are random YAML documents, mutations of every built-in plan
(wrong types, unknown keys, deleted or doubled entries, deep nesting, huge numbers, anchors and
aliases, YAML tags, non-UTF-8 bytes, control characters, truncation) and sets of files whose
``extends`` chains run in circles. Loading each one either gives a plan, whose ``resolve`` text
loads back to an equal plan, or raises :class:`pipeline.PlanError` naming the file (one of the
files of the chain) and a line inside it. Any other exception fails the test with its traceback.
"""
from __future__ import annotations

import re
from pathlib import Path

import attrs
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import PlanError, load_plan
from pipeline.plan import TOP_LEVEL_KEYS
from pipeline.plan.text import diff_plans, resolve_text

PLANS_DIR = Path(pipeline.__file__).resolve().parent.parent / "plans"
BUILTIN_TEXTS = {p.stem: p.read_text() for p in sorted(PLANS_DIR.glob("*.yaml"))}
BUILTIN_DATA = {name: yaml.safe_load(text) for name, text in BUILTIN_TEXTS.items()}

HOSTILE = settings(max_examples=500, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))


def _words() -> list[str]:
    registry = pipeline.get_registry()
    words = set(TOP_LEVEL_KEYS) | set(registry.passes) | set(BUILTIN_TEXTS)
    for entry in registry.passes.values():
        words |= {f.name for f in attrs.fields(entry.cls.Options)}
    words |= {"off", "final", "each", "raise", "eager", "auto", "cpu", "cuda", "dynamo", "export",
              "core-aten", "custom", "none", "aten.addmm", "aten.adm", "yes", "no", "on", "null", "~",
              "true", "False", "full", "any", "error", "warn", "triton", "cpp", "default.yaml", ""}
    return sorted(words)


WORDS = _words()
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.sampled_from(WORDS), TEXT,
    st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
)
KEYS = st.one_of(st.sampled_from(WORDS), TEXT, st.integers(-5, 5), st.booleans(), st.none())
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=16)


def dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


# -- structural mutations of built-in plans --------------------------------------------------------
def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _paths(value, prefix + (index,))


def _replace(data, path, make):
    if not path:
        return make(data)
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        out = dict(data)
        out[head] = _replace(data[head], rest, make)
        return out
    out = list(data)
    out[head] = _replace(data[head], rest, make)
    return out


def _delete(data, path):
    if len(path) == 1:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k != path[0]}
        return [v for i, v in enumerate(data) if i != path[0]]
    head = path[0]
    child = _delete(data[head], path[1:])
    if isinstance(data, dict):
        return {**data, head: child}
    return [child if i == head else v for i, v in enumerate(data)]


@st.composite
def mutated_builtin(draw) -> str:
    """A built-in plan with one to three structural edits, dumped back to YAML."""
    name = draw(st.sampled_from(sorted(BUILTIN_DATA)))
    data = BUILTIN_DATA[name]
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(data))
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["replace", "delete", "wrap-list", "wrap-map", "nest", "add-key",
                                     "typo", "stringify"]))
        if kind == "replace":
            value = draw(VALUES)
            data = _replace(data, path, lambda _old: value)
        elif kind == "delete" and path:
            data = _delete(data, path)
        elif kind == "wrap-list":
            data = _replace(data, path, lambda old: [old])
        elif kind == "wrap-map":
            key = draw(KEYS)
            data = _replace(data, path, lambda old: {key: old})
        elif kind == "nest":
            depth = draw(st.integers(2, 120))

            def nest(old, depth=depth):
                for _ in range(depth):
                    old = [old]
                return old
            data = _replace(data, path, nest)
        elif kind == "add-key":
            key, value = draw(KEYS), draw(VALUES)
            data = _replace(data, path, lambda old: {**old, key: value} if isinstance(old, dict) else old)
        elif kind == "typo":
            index = draw(st.integers(0, 30))
            data = _replace(data, path, lambda old: old[:index] + old[index + 1:]
                            if isinstance(old, str) else old)
        else:
            data = _replace(data, path, lambda old: str(old))
    return dump(data)


# -- text and byte mutations -----------------------------------------------------------------------
SNIPPETS = [
    "\t", "  ", "\n", ": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "*undefined", "<<: *a\n",
    "!!int abc", "!!float x", "!!set {a}", "!!binary aGk=", "!!python/object/apply:os.system [true]",
    "!custom ", "!!timestamp 2020-01-01", "2020-01-01", "---\n", "...\n", "%YAML 1.1\n", "? ", "|\n",
    ">-\n", "'", '"', "#", "~", ".nan", "-.inf", "1e999", "1.0e999", "0x1F", "0o17", "1_000",
    "9" * 5000, "-" + "9" * 80, "\ufeff", "\u2028", "\x85",
]
BYTES = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\x07", b"\x1b", b"\xef\xbb\xbf", b"\r", b"\r\n"]


@st.composite
def text_mutations(draw, text: str) -> bytes:
    chars = text
    for _ in range(draw(st.integers(0, 3))):
        position = draw(st.integers(0, len(chars)))
        kind = draw(st.sampled_from(["insert", "delete", "truncate", "nest", "alias", "duplicate-line"]))
        if kind == "insert":
            chars = chars[:position] + draw(st.sampled_from(SNIPPETS)) + chars[position:]
        elif kind == "delete":
            chars = chars[:position] + chars[position + draw(st.integers(1, 8)):]
        elif kind == "truncate":
            chars = chars[:position]
        elif kind == "nest":
            depth = draw(st.integers(1, 300))
            chars = chars[:position] + "[" * depth + "x" + "]" * depth + chars[position:]
        elif kind == "alias":
            chars = re.sub(r": (\S)", r": &a \1", chars, count=1) + "\ndescription: *a\n"
        else:
            lines = chars.splitlines(keepends=True)
            if lines:
                line = draw(st.sampled_from(lines))
                chars += line if line.endswith("\n") else "\n" + line
    data = chars.encode("utf-8")
    if draw(st.booleans()):
        position = draw(st.integers(0, len(data)))
        data = data[:position] + draw(st.sampled_from(BYTES)) + data[position:]
    return data


@st.composite
def billion_laughs(draw) -> bytes:
    levels = draw(st.integers(1, 9))
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    target = draw(st.sampled_from(["description", "passes", "remove", "options", "expect", "name"]))
    header = ["name: laughs", "extends: default"] if target != "name" else ["extends: default"]
    return "\n".join(header + lines + [f"{target}: *l{levels - 1}"]).encode() + b"\n"


DOCUMENTS = st.one_of(
    VALUES.map(lambda v: dump(v).encode()),
    st.dictionaries(st.sampled_from(TOP_LEVEL_KEYS), VALUES, max_size=6).map(lambda d: dump(d).encode()),
    mutated_builtin().map(str.encode),
    mutated_builtin().flatmap(text_mutations),
    st.sampled_from(sorted(BUILTIN_TEXTS.values())).flatmap(text_mutations),
    billion_laughs(),
    st.sampled_from([b"", b"\n\n", b"   \n", b"# only a comment\n", b"\xef\xbb\xbf", b"---\n", b"...\n",
                     "name: p\npasses: [capture]\n".encode("utf-16"), b"\x00\x01\x02", b"\xff\xfe\xfd"]),
)


@st.composite
def plan_files(draw) -> list[tuple[str, bytes]]:
    """One to four files; the first is loaded. Later files are its ``extends`` targets, and any of
    them may extend any other (including itself) or a built-in plan: chains, cycles, diamonds."""
    count = draw(st.integers(1, 4))
    names = [f"p{i}.yaml" for i in range(count)]
    files = []
    for index, name in enumerate(names):
        body = draw(DOCUMENTS)
        if count > 1 or draw(st.booleans()):
            target = draw(st.sampled_from(names + sorted(BUILTIN_TEXTS) + ["missing.yaml", "../p0.yaml",
                                                                         "x" * 300 + ".yaml", "a\\0b"]))
            if draw(st.booleans()):
                body = re.sub(rb"(?m)^extends:.*$", b"", body)
                body = f"extends: \"{target}\"\n".encode() + body
        files.append((name, body))
    return files


def _line_count(body: bytes) -> int:
    """Lines as YAML counts them (\\r, \\x85 and U+2028 end lines too), plus one past the end."""
    text = body.decode("utf-8", errors="replace")
    return len(text.splitlines()) + 1


def assert_loads_or_located_error(folder: Path, files: list[tuple[str, bytes]]) -> None:
    for name, body in files:
        (folder / name).write_bytes(body)
    written = {str(folder / name): body for name, body in files}
    builtins = {str(PLANS_DIR / f"{name}.yaml"): text.encode() for name, text in BUILTIN_TEXTS.items()}
    try:
        plan = load_plan(folder / files[0][0])
    except PlanError as exc:
        event("PlanError" + (" without a line" if exc.line is None else ""))
        known = {**written, **builtins}
        assert exc.file in known, f"error names {exc.file!r}, not a file of the chain: {exc}"
        assert str(exc).startswith(f"{exc.file}"), str(exc)
        assert len(exc.reason) <= 1000, f"an error quotes too much: {exc.reason[:2000]}"
        if exc.line is None:
            assert exc.reason.startswith("the plan is empty"), f"no line in: {exc}"
        else:
            lines = _line_count(known[exc.file])
            assert 1 <= exc.line <= lines, f"line {exc.line} outside a {lines}-line file: {exc}"
        return
    event("loaded")
    resolved = folder / "resolved.yaml"
    resolved.write_text(resolve_text(plan))
    assert load_plan(resolved) == plan
    diff_plans(plan, load_plan("default"))


@HOSTILE
@given(files=plan_files())
def test_any_hostile_plan_loads_or_raises_a_located_plan_error(tmp_path_factory, files):
    assert_loads_or_located_error(tmp_path_factory.mktemp("hostile"), files)


@settings(HOSTILE, max_examples=150)
@given(data=st.dictionaries(KEYS, VALUES, max_size=6), base=st.sampled_from(sorted(BUILTIN_TEXTS)))
def test_hostile_overrides_raise_plan_errors_naming_the_overrides(data, base):
    try:
        load_plan(base, data)
    except PlanError as exc:
        assert exc.file in ("<overrides>", str(PLANS_DIR / f"{base}.yaml")), str(exc)
        assert str(exc).startswith(exc.file)


@settings(HOSTILE, max_examples=150)
@given(data=VALUES)
def test_hostile_dict_plans_raise_plan_errors_naming_the_dict(data):
    try:
        load_plan(data if isinstance(data, dict) else {"name": "p", "passes": data})
    except PlanError as exc:
        assert exc.file in ("<dict>", *(str(p) for p in PLANS_DIR.glob("*.yaml"))), str(exc)


# -- the worst cases, each spelled out ----------------------------------------------------------
def load_error(path: Path) -> PlanError:
    try:
        load_plan(path)
    except PlanError as exc:
        return exc
    raise AssertionError(f"{path} loaded")


def test_nesting_deeper_than_the_limit_names_its_line(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("name: p\npasses: [capture]\ndescription: " + "[" * 5000 + "]" * 5000 + "\n")
    exc = load_error(path)
    assert (exc.file, exc.line) == (str(path), 3) and "nests more than" in exc.reason


def test_a_control_character_names_its_line(tmp_path):
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"name: p\npasses: [capture]\ndescription: a\x00b\n")
    exc = load_error(path)
    assert (exc.file, exc.line) == (str(path), 3) and "U+0000" in exc.reason


def test_an_integer_with_thousands_of_digits_names_its_line(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("name: p\npasses:\n  - capture: {recompile_limit: " + "9" * 5000 + "}\n")
    exc = load_error(path)
    assert (exc.file, exc.line) == (str(path), 3) and "cannot read int" in exc.reason


def test_a_scalar_its_tag_cannot_hold_names_its_line(tmp_path):
    path = tmp_path / "tag.yaml"
    path.write_text("name: p\npasses: [capture]\nverify: !!int off\n")
    exc = load_error(path)
    assert (exc.file, exc.line) == (str(path), 3) and "cannot read int" in exc.reason


def test_a_timestamp_tag_on_something_that_is_no_date_names_its_line(tmp_path):
    path = tmp_path / "when.yaml"
    path.write_text("name: p\npasses: [capture]\ndescription: !!timestamp 2020-01-01# not a date\n")
    exc = load_error(path)
    assert (exc.file, exc.line) == (str(path), 3) and "cannot read timestamp" in exc.reason


def test_an_extends_name_the_os_refuses_names_the_extends_line(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("name: p\nextends: " + "x" * 5000 + ".yaml\n")
    exc = load_error(path)
    assert (exc.file, exc.line, exc.key) == (str(path), 2, "extends") and "File name too long" in exc.reason


def test_an_extends_chain_longer_than_the_limit_is_an_error_not_a_recursion_error(tmp_path):
    count = 1200
    for i in range(count):
        (tmp_path / f"p{i}.yaml").write_text(f"name: p{i}\nextends: p{i + 1}.yaml\n" if i < count - 1
                                             else "name: last\nextends: default\n")
    exc = load_error(tmp_path / "p0.yaml")
    assert exc.key == "extends" and exc.line == 2 and "chains more than" in exc.reason


def test_removing_every_pass_names_the_remove_line(tmp_path):
    path = tmp_path / "empty.yaml"
    names = [p.name for p in load_plan("default").passes]
    path.write_text(f"name: p\nextends: default\nremove: [{', '.join(names)}]\n")
    exc = load_error(path)
    assert (exc.line, exc.key) == (3, "remove") and "without passes" in exc.reason


def test_a_scalar_document_names_its_line(tmp_path):
    path = tmp_path / "scalar.yaml"
    path.write_text("# a comment\n\n42\n")
    exc = load_error(path)
    assert exc.line == 3 and "got int" in exc.reason


def test_a_yaml_set_is_rejected_at_its_line(tmp_path):
    path = tmp_path / "set.yaml"
    path.write_text("name: p\npasses: !!set {capture}\n")
    exc = load_error(path)
    assert exc.line == 2 and "!!set" in exc.reason


def test_billion_laughs_aliases_load_in_bounded_time(tmp_path):
    lines = ["name: laughs", "extends: default", "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, 12):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    exc = load_error(path)
    assert exc.line == 3 and exc.key == "l0"


# -- size limits: rejected before the expensive work, quoted user text kept short ---------------
import time  # noqa: E402

import pytest  # noqa: E402

from pipeline import yamlio  # noqa: E402
from pipeline.plan.yamlio import load_yaml  # noqa: E402


LIMIT = f"{yamlio.MAX_PLAN_BYTES >> 10} KiB"


def test_a_plan_file_over_the_size_limit_is_rejected_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("name: big\npasses: [capture]\ndescription: " + "x" * (8 << 20) + "\n")
    start = time.perf_counter()
    exc = load_error(path)
    assert time.perf_counter() - start < 5.0          # parsing it took over 20 s
    assert (exc.file, exc.line) == (str(path), None)
    assert f"at most {LIMIT}" in exc.reason and f"{path.stat().st_size} bytes" in exc.reason


def test_a_plan_file_at_the_size_limit_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(yamlio, "MAX_PLAN_BYTES", 200)
    text = "name: p\npasses: [capture]\ndescription: "
    path = tmp_path / "edge.yaml"
    path.write_text(text + "x" * (200 - len(text) - 1) + "\n")
    assert len(path.read_bytes()) == 200
    assert load_plan(path).name == "p"
    path.write_text(text + "x" * (200 - len(text)) + "\n")
    assert "at most 200 bytes" in load_error(path).reason


def test_yaml_text_over_the_size_limit_is_rejected():
    try:
        load_yaml("a: " + "x" * (2 << 20), "<text>")
    except PlanError as exc:
        assert exc.file == "<text>" and f"at most {LIMIT}" in exc.reason
    else:
        raise AssertionError("2 MiB of YAML loaded")


def test_a_plan_with_more_values_than_the_limit_stops_where_it_passes_it(tmp_path):
    path = tmp_path / "many.yaml"
    path.write_text("name: p\npasses:\n  - capture\n" + "  - dce\n" * (4 * yamlio.MAX_NODES))
    exc = load_error(path)
    assert exc.file == str(path) and f"more than {yamlio.MAX_NODES} YAML values" in exc.reason
    assert exc.line <= yamlio.MAX_NODES          # of a file of 4 times as many lines: it stopped there


def test_a_plan_of_many_aliases_counts_each_use(tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text("name: p\npasses:\n  - capture\n  - &a dce\n" + "  - *a\n" * (2 * yamlio.MAX_NODES))
    exc = load_error(path)
    assert f"more than {yamlio.MAX_NODES} YAML values" in exc.reason and exc.line <= yamlio.MAX_NODES


@pytest.mark.parametrize("plan", [
    {"name": "p", "passes": ["capture"] + ["dce"] * 3_000_000},
    {"name": "p", "passes": ["capture"] + ["dce"] * 6_000},
    {"name": "p", "passes": ["capture", "x" * (10 << 20)]},
    {"name": "p", "passes": ["capture"], "description": "x" * (2 << 20)},
    {"name": "p", "passes": ["capture"], "expect": {f"k{i}": i for i in range(1_000_000)}},
], ids=["3M passes", "6k passes", "10 MB pass name", "2 MiB description", "1M keys"])
def test_a_dict_plan_over_the_limits_is_rejected_before_validation(plan):
    start = time.perf_counter()
    try:
        load_plan(plan)
    except PlanError as exc:
        assert exc.file == "<dict>" and "a plan" in exc.reason, str(exc)[:300]
        assert f"more than {yamlio.MAX_NODES} values" in exc.reason or f"more than {LIMIT}" in exc.reason
        assert len(str(exc)) < 300
    else:
        raise AssertionError("a dict plan over the limit loaded")
    assert time.perf_counter() - start < 2.0


def test_overrides_over_the_limits_are_rejected():
    exc = load_error_of("default", {"description": "x" * (2 << 20)})
    assert exc.file == "<overrides>" and f"more than {LIMIT}" in exc.reason


def test_a_dict_plan_that_contains_itself_is_an_error_not_a_hang():
    plan: dict = {"name": "p", "passes": ["capture"]}
    plan["expect"] = plan
    assert load_error_of(plan).file == "<dict>"


def load_error_of(plan, overrides=None) -> PlanError:
    try:
        load_plan(plan, overrides)
    except PlanError as exc:
        return exc
    raise AssertionError("loaded")


def test_a_key_longer_than_the_limit_names_its_line_without_repeating_it(tmp_path):
    path = tmp_path / "key.yaml"
    path.write_text("name: p\npasses: [capture]\n" + "k" * 300 + ": 1\n")
    exc = load_error(path)
    assert (exc.file, exc.line) == (str(path), 3)
    assert "256 characters" in exc.reason and len(str(exc)) < 300


def test_a_pass_name_longer_than_the_limit_is_not_repeated_whole(tmp_path):
    path = tmp_path / "name.yaml"
    path.write_text("name: p\npasses:\n  - capture\n  - " + "a" * 100_000 + "\n")
    exc = load_error(path)
    assert (exc.file, exc.line, exc.key) == (str(path), 4, "passes[1]")
    assert "256 characters" in exc.reason and len(str(exc)) < 300


def test_a_long_misspelled_value_is_quoted_cut_short(tmp_path):
    path = tmp_path / "value.yaml"
    path.write_text("name: p\npasses:\n  - capture: {frontend: " + "d" * 5000 + "}\n")
    exc = load_error(path)
    assert exc.line == 3 and len(str(exc)) < 300 and "..." in str(exc)
    path.write_text("name: p\npasses: [capture]\nverify: " + "e" * 5000 + "\n")
    exc = load_error(path)
    assert exc.line == 3 and len(str(exc)) < 300 and "..." in str(exc)


def test_long_unknown_names_are_quoted_cut_short(tmp_path):
    name = "z" * 250
    for text in (f"name: p\nextends: default\nremove: [{name}]\n",
                 f"name: p\nextends: default\noptions:\n  {name}: {{}}\n",
                 f"name: p\npasses:\n  - capture: {{{name}: 1}}\n",
                 f"name: p\npasses:\n  - {name}\n",
                 f"name: p\nextends: {name}\n"):
        path = tmp_path / "unknown.yaml"
        path.write_text(text)
        exc = load_error(path)
        assert len(str(exc)) < 500 and "..." in exc.reason, str(exc)[:600]
