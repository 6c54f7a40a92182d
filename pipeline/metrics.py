"""Measurements of compiled graphs that passes register, and the plan expectations they answer.

The engine knows no pass's concepts: a pass package registers :class:`Metric` objects through the
``pipeline_register_metrics`` hook (the built-in passes register ``kernels``, ``contents`` and
``cudagraphs``). After every graph compiles, each metric measures the final graph; the value lands
in the graph's record (``record.metrics[name]``, also readable as ``record.<name>``), in the
compile report, and is checked against the plan's ``expect:`` keys the metric declares in its
``limits`` option class (declared like a pass's options, so plan errors name file, line and key)."""
from __future__ import annotations

import copy
from typing import Any, Callable, Literal

import attrs

from pipeline.options import NoOptions, non_negative, option, positive


@attrs.frozen
class ExpectationFields:
    """What a compile must achieve; checked after every call that compiled something. Passes add
    keys of their own through the metrics they register (table below)."""

    max_graph_breaks: int | None = option(None, "Most graph breaks allowed (null: no limit).", check=non_negative)
    max_recompiles: int | None = option(None, "Most recompiles allowed, not counting warm-up of the declared "
                                              "shape buckets (null: no limit).", check=non_negative)
    max_compile_seconds: float | None = option(None, "Most seconds of compile work (null: no limit).",
                                               check=positive)
    on_miss: Literal["error", "warn"] = option("error", "What a missed expectation does.")


@attrs.frozen
class Outcome:
    """One checked expectation: its ``expect:`` key, the plan's limit, what the compile measured
    and whether it holds."""

    key: str
    limit: Any
    measured: Any
    ok: bool
    text: str | None = None    # the miss message; default "expect.KEY is LIMIT but the compile measured VALUE"

    def message(self) -> str:
        """What the plan's ``expect:`` error or warning says about this expectation."""
        return self.text or f"expect.{self.key} is {self.limit} but the compile measured {self.measured}"

    def to_data(self) -> dict:
        """The report's row for this expectation."""
        return {"key": self.key, "limit": self.limit, "measured": self.measured, "ok": self.ok}


def _no_check(limits: Any, values: list) -> list[Outcome]:
    return []


@attrs.frozen
class Metric:
    """A measurement of every compiled graph.

    ``measure(graph, context)`` returns a JSON-ready value for the final graph module and its
    :class:`pipeline.PassContext`. ``limits`` is an options class whose fields are ``expect:``
    keys; ``check(limits, values)`` gets the plan's limits and the values of all graphs compiled
    so far and returns one :class:`Outcome` per limit that is set. ``total(values)``, when given,
    puts the sum over graphs into the report's summary; ``default`` is the value of a graph nothing
    was measured on. ``report(value, notes)`` returns the keys
    the metric adds to a graph's report entry (default ``{name: value}``); ``log(graph_id, value,
    notes)`` writes the metric's log lines after each compile; ``sections`` are report-page
    sections, ``{id: (title, render(report) -> html)}``."""

    name: str
    doc: str
    measure: Callable[[Any, Any], Any]
    limits: type = NoOptions
    check: Callable[[Any, list], list[Outcome]] = _no_check
    total: Callable[[list], Any] | None = None
    report: Callable[[Any, list], dict] | None = None
    log: Callable[[str, Any, list], None] | None = None
    sections: dict = attrs.field(factory=dict)
    #: The value of a graph nothing was measured on (a joint training graph, one that failed).
    default: Any = None

    def report_entry(self, value: Any, notes: list) -> dict:
        """The keys this metric adds to a graph's entry in the compile report."""
        return self.report(value, notes) if self.report is not None else {self.name: value}


def limit_fields(metrics: dict[str, Metric]) -> dict[str, tuple[Metric, Any]]:
    """``expect:`` key -> (metric, attrs field) over the registered metrics."""
    return {f.name: (metric, f) for metric in metrics.values() for f in attrs.fields(metric.limits)}


def default_limits(metrics: dict[str, Metric]) -> dict[str, Any]:
    """Every metric's ``expect:`` keys with their defaults."""
    return {name: attrs.fields_dict(m.limits)[name].default for name, (m, _) in limit_fields(metrics).items()}


def check_limits(metrics: dict[str, Metric], limits: dict[str, Any], records: list) -> list[Outcome]:
    """The outcome of every metric limit the plan sets, over the compiled graphs' records."""
    out = []
    for metric in metrics.values():
        names = [f.name for f in attrs.fields(metric.limits)]
        if not names:
            continue
        given = metric.limits(**{n: limits.get(n, attrs.fields_dict(metric.limits)[n].default) for n in names})
        values = [r.metrics[metric.name] for r in records if metric.name in r.metrics]
        out.extend(metric.check(given, values))
    return out


def defaults(metrics: dict[str, Metric]) -> dict[str, Any]:
    """Every metric's value for a graph nothing was measured on."""
    return {name: copy.deepcopy(metric.default) for name, metric in metrics.items()}


def measure_all(metrics: dict[str, Metric], graph: Any, context: Any) -> dict[str, Any]:
    """Every metric's value for one final graph."""
    return {name: metric.measure(graph, context) for name, metric in metrics.items()}


__all__ = ["ExpectationFields", "Metric", "Outcome", "check_limits", "default_limits", "limit_fields", "measure_all"]
