"""The zoo's figures, as torch's dashboard gives them: per family and overall, for every variant,
the pass rate, the geomean speed-up over eager, compile time and peak-memory ratio; ours against
Inductor in the same mode; and the models where ours trails Inductor most. Written as JSON, a
Markdown page and (when matplotlib imports) a PNG of the speed-up per model."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from zoo.measure import geomean
from zoo.variants import same_mode

PASSING = "pass"


def _rows(result: dict, mode: str) -> list[dict]:
    return [r for r in result["records"] if r.get("mode") == mode]


def _variants(records: list[dict]) -> list[str]:
    seen: list[str] = []
    for record in records:
        for name in record.get("variants", {}):
            if name not in seen:
                seen.append(name)
    return seen


def family_summary(records: list[dict]) -> dict[str, dict]:
    """Per variant, over the records given: models attempted (eager ran), passing, pass rate,
    geomean speed-up over eager, geomean and median cold compile seconds, geomean memory ratio."""
    out: dict[str, dict] = {}
    attempted = [r for r in records if r.get("variants", {}).get("eager", {}).get("status") == PASSING]
    for name in _variants(records):
        if name == "eager":
            continue
        passing = [r for r in attempted if r["variants"].get(name, {}).get("status") == PASSING]
        speedups = [r["variants"]["eager"]["ms"] / r["variants"][name]["ms"] for r in passing
                    if r["variants"]["eager"].get("ms") and r["variants"][name].get("ms")]
        compile_s = [r["variants"][name]["cold_s"] for r in passing if r["variants"][name].get("cold_s")]
        memory = [r["variants"][name]["peak_bytes"] / r["variants"]["eager"]["peak_bytes"] for r in passing
                  if r["variants"][name].get("peak_bytes") and r["variants"]["eager"].get("peak_bytes")]
        out[name] = {"attempted": len(attempted), "passing": len(passing),
                     "pass_rate": len(passing) / len(attempted) if attempted else None,
                     "speedup": geomean(speedups), "compile_s": geomean(compile_s),
                     "compile_s_median": statistics.median(compile_s) if compile_s else None,
                     "memory_ratio": geomean(memory)}
        against = same_mode(name)
        if against:
            ratios = [r["variants"][against]["ms"] / r["variants"][name]["ms"] for r in passing
                      if r["variants"].get(against, {}).get("status") == PASSING
                      and r["variants"][against].get("ms") and r["variants"][name].get("ms")]
            out[name]["vs_inductor"] = geomean(ratios)
            out[name]["below_0_9_of_inductor"] = sum(1 for v in ratios if v < 0.9)
    return out


def summarize(result: dict) -> dict:
    """``{mode: {family or "all": family_summary}}`` plus the trailing models per mode."""
    out: dict[str, Any] = {}
    for mode in ("inference", "training"):
        records = _rows(result, mode)
        if not records:
            continue
        families = sorted({r["family"] for r in records})
        out[mode] = {"all": family_summary(records), **{f: family_summary([r for r in records if r["family"] == f])
                                                         for f in families}}
        out[f"{mode}_trailing"] = trailing(records)
    return out


def trailing(records: list[dict], count: int = 10) -> list[dict]:
    """The models where ours is slowest relative to Inductor in the same mode (or fails where
    Inductor passes), worst first."""
    rows = []
    for record in records:
        for ours, theirs in _pairs([record]):
            mine, other = record["variants"].get(ours), record["variants"].get(theirs)
            if not mine or not other or other.get("status") != PASSING:
                continue
            if mine.get("status") != PASSING:
                rows.append({"model": record["model"], "variant": ours, "ratio": 0.0,
                             "why": mine.get("error", mine.get("status"))})
            elif mine.get("ms") and other.get("ms"):
                rows.append({"model": record["model"], "variant": ours, "ratio": other["ms"] / mine["ms"],
                             "ours_ms": mine["ms"], "inductor_ms": other["ms"],
                             "ours_launches": mine.get("launches"), "inductor_launches": other.get("launches"),
                             "ours_host_ms": mine.get("host_ms"), "inductor_host_ms": other.get("host_ms"),
                             "ours_gpu_ms": mine.get("gpu_ms"), "inductor_gpu_ms": other.get("gpu_ms")})
    return sorted(rows, key=lambda r: r["ratio"])[:count]


def _pairs(records: list[dict]) -> list[tuple[str, str]]:
    """(variant of ours, the Inductor variant it is judged against) for the variants that ran."""
    names = dict.fromkeys(name for r in records for name in r.get("variants", {}))
    return [(name, same_mode(name)) for name in names if same_mode(name)]


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def markdown(result: dict, summary: dict) -> str:
    """The results page: what ran where, the summary per mode and family, trailing models, and
    one row per model."""
    lines = [f"# Model zoo, {result['device']}", "",
             f"{result['date']}, commit `{result['commit']}`, torch {result['torch']}, size `{result['size']}`; "
             f"{result['rounds']} interleaved rounds of {result['iters']} calls per variant; {result['jobs']} "
             f"model process(es) at once (one timing at a time).", "", *[f"- {n}" for n in result.get("notes", [])],
             *([""] if result.get("notes") else [])]
    for mode in ("inference", "training"):
        if mode not in summary:
            continue
        lines += [f"## {mode.capitalize()}: summary", "",
                  "| family | variant | pass | geomean speed-up vs eager | vs Inductor same mode | "
                  "below 0.9x Inductor | compile s (geomean) | memory ratio |", "|---|---|---|---|---|---|---|---|"]
        for family, variants in summary[mode].items():
            for name, s in variants.items():
                lines.append(f"| {family} | {name} | {s['passing']}/{s['attempted']} | {_fmt(s['speedup'], '.2f', 'x')} | "
                             f"{_fmt(s.get('vs_inductor'), '.2f', 'x')} | {s.get('below_0_9_of_inductor', '-')} | "
                             f"{_fmt(s['compile_s'], '.1f')} | {_fmt(s['memory_ratio'], '.2f')} |")
        lines += ["", f"### {mode.capitalize()}: where ours trails Inductor most", "",
                  "| model | variant | Inductor ms / ours ms | ours ms (host, GPU, launches) | Inductor ms (host, GPU, launches) |",
                  "|---|---|---|---|---|"]
        for row in summary[f"{mode}_trailing"]:
            if "why" in row:
                lines.append(f"| {row['model']} | {row['variant']} | fails | {row['why'][:120]} | |")
                continue
            lines.append(f"| {row['model']} | {row['variant']} | {row['ratio']:.2f} | "
                         f"{row['ours_ms']:.3f} ({_fmt(row['ours_host_ms'], '.2f')}, {_fmt(row['ours_gpu_ms'], '.2f')}, "
                         f"{_fmt(row['ours_launches'], '.0f')}) | {row['inductor_ms']:.3f} ({_fmt(row['inductor_host_ms'], '.2f')}, "
                         f"{_fmt(row['inductor_gpu_ms'], '.2f')}, {_fmt(row['inductor_launches'], '.0f')}) |")
        lines += ["", f"## {mode.capitalize()}: every model", ""]
        records = _rows(result, mode)
        names = _variants(records)
        lines += ["| model | family | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for record in records:
            cells = []
            for name in names:
                entry = record.get("variants", {}).get(name)
                if not entry:
                    cells.append("-")
                elif entry.get("status") != PASSING:
                    cells.append(f"{entry.get('status')}: {str(entry.get('error', ''))[:80]}")
                else:
                    cells.append(f"{_fmt(entry.get('ms'), '.3f')} ms, {_fmt(entry.get('cold_s'), '.1f')} s")
            if record.get("skipped") or record.get("error"):
                cells = [f"{'skipped' if record.get('skipped') else 'error'}: "
                         f"{str(record.get('skipped') or record.get('error'))[:120]}"] + [""] * (len(names) - 1)
            model = f"{record['model']} ({record['note']})" if record.get("note") else record["model"]
            lines.append(f"| {model} | {record['family']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    """Speed-up over eager per model, ours against Inductor in each mode; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    records = [r for r in result["records"] if r.get("variants")]
    pairs = _pairs(records)
    if not records or not pairs:
        return False
    fig, axes = plt.subplots(len(pairs), 1, figsize=(max(8, len(records) * 0.4), 3.2 * len(pairs)), squeeze=False)
    for axis, (ours, theirs) in zip(axes[:, 0], pairs):
        rows = [r for r in records if ours in r["variants"]]
        labels = [f"{r['model']}" for r in rows]

        def speed(r: dict, name: str) -> float:
            e, v = r["variants"].get("eager", {}), r["variants"].get(name, {})
            return e["ms"] / v["ms"] if v.get("status") == PASSING and e.get("ms") and v.get("ms") else 0.0

        x = range(len(rows))
        axis.bar([i - 0.2 for i in x], [speed(r, theirs) for r in rows], width=0.4, label=theirs)
        axis.bar([i + 0.2 for i in x], [speed(r, ours) for r in rows], width=0.4, label=ours)
        axis.axhline(1.0, color="black", linewidth=0.5)
        axis.set_xticks(list(x))
        axis.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        axis.set_ylabel("speed-up over eager")
        axis.legend(fontsize=7)
    fig.suptitle(f"Model zoo, {result['device']}, {result['date']}, {result['commit']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_results(result: dict, out: Path, stem: str) -> list[Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` under ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(result)
    result = dict(result, summary=summary)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=1, default=str))
    paths[1].write_text(markdown(result, summary))
    if plot(result, out / f"{stem}.png"):
        paths.append(out / f"{stem}.png")
    return paths


__all__ = ["family_summary", "markdown", "plot", "summarize", "trailing", "write_results"]
