"""The headline table of benchmarks/README.md, gathered by *reading* the other sections.

Nothing is re-run: each row is parsed from the tables another benchmark wrote into the README (so it
always matches the figure printed beside its own command), and names that section. A section that
is missing or whose table has changed shape yields a row saying so instead of a number.

    python benchmarks/summary.py                  # print the table
    python benchmarks/reproduce.py --part headline --write-readme
"""

from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"
Table = list[dict[str, str]]


def section(text: str, tag: str) -> str | None:
    """The text between ``<!-- tag:begin -->`` (or ``:start``) and its end marker, or None."""
    m = re.search(rf"<!-- {re.escape(tag)}:(?:begin|start) -->(.*?)<!-- {re.escape(tag)}:end -->", text, re.S)
    return m.group(1) if m else None


def tables(md: str) -> list[Table]:
    """Every markdown table in ``md`` as a list of {header: cell} rows."""
    return [t for _, t in captioned_tables(md)]


def captioned_tables(md: str) -> list[tuple[str, Table]]:
    """(caption, table) for every markdown table; the caption is the last text line before it."""
    out: list[tuple[str, Table]] = []
    lines = md.splitlines()
    caption = ""
    i = 0
    while i < len(lines) - 1:
        if lines[i].strip() and not lines[i].startswith("|"):
            caption = lines[i].strip()
        if lines[i].startswith("|") and re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", lines[i + 1]):
            head = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                cells = [c.strip() for c in lines[j].strip().strip("|").split("|")]
                rows.append(dict(zip(head, cells)))
                j += 1
            out.append((caption, rows))
            i = j
        else:
            i += 1
    return out


def num(cell: str) -> float | None:
    """The first number in a cell (``1.31×``, ``+0.2 %``, ``8.7*``, ``1,024``), else None."""
    m = re.search(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?", cell or "")
    return float(m.group(0).replace(",", "")) if m else None


def col(t: Table, pred: Callable[[str], bool]) -> str | None:
    return next((h for h in (t[0] if t else {}) if pred(h.lower())), None)


def _rng(vals: list[float], spec: str, unit: str = "") -> str:
    return f"{min(vals):{spec}}–{max(vals):{spec}}{unit}" if vals else "–"


# ----------------------------------------------------------------------------- per-section extractors
def _parts(cell: str, header: str, name: str) -> float | None:
    """The component ``name`` of a ``a / b / c`` cell whose header reads ``solver a / b / c``."""
    keys = [k.strip() for k in header.split(" ", 1)[1].split("/")] if " " in header else []
    vals = [v.strip() for v in cell.split("/")]
    for k, v in zip(keys, vals):
        if k.startswith(name):
            return num(v)
    return None


def planner(md: str) -> str:
    out = []
    for t in tables(md):
        exact = [h for h in (t[0] if t else {}) if h.startswith(("cpsat", "milp")) and "gap" in h]
        if not exact:
            continue
        if "cluster" in t[0]:  # example clusters: gap and time per exact solver
            for h in exact:
                gaps = [v for r in t if (v := _parts(r[h], h, "gap")) is not None]
                times = [v for r in t if (v := _parts(r[h], h, "time")) is not None]
                if gaps:
                    out.append(f"{h.split()[0]} gap to best bound median {statistics.median(gaps):.1f} %, max "
                               f"{max(gaps):.1f} % ({len(gaps)} problems, solve ≤ {max(times):.0f} s)")
        elif "GPUs" in t[0]:  # scaling
            h = exact[0]
            last = t[-1]
            g = _parts(last[h], h, "gap")
            out.append(f"{h.split()[0]} at {last['GPUs']} GPUs: gap {'–' if g is None else f'{g:.1f} %'}")
    return "; ".join(out)


def heuristics(md: str) -> str:
    out = []
    for caption, t in captioned_tables(md):
        label = caption.rstrip(":").lower() if caption.lower().startswith("recompute") else ""
        for h in (t[0] if t else {}):
            if h.startswith("fixed vs") or h.lower().startswith("hexiscale / cp-sat"):
                vals = [v for r in t if (v := num(r.get(h, ""))) is not None]
                if vals:
                    what = h.split(" ", 1)[1] if h.startswith("fixed") else "/ CP-SAT"
                    spec = ".2f" if h.startswith("fixed") else ".3f"
                    out.append(f"hexiscale {what}{f' ({label})' if label else ''}: {_rng(vals, spec, '×')} "
                               f"({len(vals)} rows)")
        if t and "GPUs" in t[0] and "solve s" in t[0] and "candidates" in t[0]:
            last = t[-1]
            out.append(f"hexiscale solve {last['solve s']} s at {last['GPUs']} GPUs")
    return "; ".join(out)


def pairing(md: str) -> str:
    bullets = [ln[2:].strip() for ln in md.splitlines() if ln.startswith("- ")]
    keep = [b for b in bullets if b.startswith(("dp == lattice", "cpsat <= dp", "hidden communication"))]
    for t in tables(md):
        c = col(t, lambda h: h.startswith("g (dp)"))
        if c:
            keep.append(f"g (dp) {_rng([v for r in t if (v := num(r[c])) is not None], '.2f')}")
    return "; ".join(keep)


def compiler(md: str) -> str:
    for t in tables(md):
        c, n = col(t, lambda h: h.startswith("compile s")), col(t, lambda h: h == "instructions")
        if c and n:
            big = max(t, key=lambda r: num(r[n]) or 0)
            return (f"largest program {big[n]} instructions ({big.get('plan', '')}, {big.get('schedule', '')}): "
                    f"compile {big[c]} s, every program valid and deadlock-free")
    return ""


def simulator(md: str) -> str:
    out = []
    for t in tables(md):
        rk, mb = col(t, lambda h: h == "ranks"), col(t, lambda h: h == "micro-batches")
        s = col(t, lambda h: h.startswith(("sim s", "cpu s")))
        if rk and mb and s:
            rows = [r for r in t if num(r[rk]) == 1024 and num(r[mb]) == 64]
            for r in rows:
                shape = r.get("stages × pipelines", "")
                out.append(f"{r.get('schedule', '')} 1,024 ranks ({shape}) × 64 micro-batches ({r.get('instructions', '?')} "
                           f"instructions): {r[s]} s ({s})")
    return "; ".join(out)


def runtime(md: str) -> str:
    out = []
    for t in tables(md):
        o = col(t, lambda h: h == "overhead")
        if o:
            out.append("replay vs hand-written loop " + ", ".join(f"{r['case']} {r[o]}" for r in t))
        c = col(t, lambda h: h.startswith("co-executed vs"))
        if c:
            out.append("co-executed vs sequential strands " + ", ".join(f"{r[next(iter(r))]} {r[c]}" for r in t))
    return "; ".join(out)


def fidelity(md: str) -> str:
    out = []
    for t in tables(md):
        tm = col(t, lambda h: h == "time mape")
        if tm:  # the summary table: one row per subset of plans
            sp, mm = col(t, lambda h: h.startswith("spearman")), col(t, lambda h: h == "memory mape")
            for r in t:
                out.append(f"{r[next(iter(r))]} ({r.get('plans', '?')} plans): time MAPE {r[tm]}"
                           + (f", Spearman {r[sp]}" if sp else "") + (f", memory MAPE {r[mm]}" if mm else ""))
    if not out:  # per-plan table only: median of its error columns
        for t in tables(md):
            for h in (t[0] if t else {}):
                if h.lower().endswith(("err", "error")):
                    vals = [abs(v) for r in t if (v := num(r.get(h, ""))) is not None]
                    if vals:
                        out.append(f"{h}: median {statistics.median(vals):.1f} %, max {max(vals):.1f} % "
                                   f"over {len(vals)} plans")
    return "; ".join(out)


def hexiscale_repro(md: str) -> str:
    ts = [t for t in tables(md) if t and col(t, lambda h: h.startswith("het / homo"))]
    if not ts:
        return ""
    t = ts[0]
    hh, rel, meg = (col(t, lambda h: h.startswith("het / homo")), col(t, lambda h: "released" in h),
                    col(t, lambda h: "megatron" in h))
    pap = col(t, lambda h: h.startswith("paper"))

    def vals(c: str | None) -> list[float]:
        return [v for r in t if c and "OOM" not in r[c] and (v := num(r[c])) is not None]

    return (f"het / equal-FLOPS homo throughput {_rng(vals(hh), '.2f', '×')} (paper {_rng(vals(pap), '.2f', '×')}); "
            f"best / hexiscale-released {_rng(vals(rel), '.2f', '×')} (feasible baselines only), best / megatron "
            f"{_rng(vals(meg), '.2f', '×')} (paper: 1.5–2.4× over heterogeneous baselines)")


def dhelix_repro(md: str) -> str:
    for t in tables(md):
        e = col(t, lambda h: h == "w gain evaluator")
        if e:
            parts = []
            for kind in ("A40", "A800", "H100"):
                rows = [r for r in t if kind in r[next(iter(r))]]
                ours = [v for r in rows if (v := num(r[e])) is not None]
                paper = [v for r in rows if (v := num(r.get("paper gain", ""))) is not None]
                if ours:
                    parts.append(f"{kind} {_rng(ours, '.2f', '×')}" + (f" (paper {_rng(paper, '.2f', '×')})"
                                                                       if paper else ""))
            return "W-shape + pairing vs 1F1B (evaluator): " + ", ".join(parts)
    return ""


ROWS: list[tuple[str, str, Callable[[str], str], str]] = [
    ("Planner: exact vs heuristics", "planner", planner, "python benchmarks/planner.py --goal"),
    ("Planner: every cluster, model, solver", "planner-full", planner, "python benchmarks/planner.py --full --time-limit 15"),
    ("Planner without recompute (CLI default)", "planner-none", planner,
     "python benchmarks/planner.py --goal --recompute none"),
    ("Planner with selective recompute", "planner-selective", planner,
     "python benchmarks/planner.py --goal --recompute selective"),
    ("Planner, larger models (13B, 30B)", "planner-models", planner,
     "python benchmarks/planner.py --goal --models llama2-13b,llama-30b"),
    ("Heuristic planners", "heuristics", heuristics, "python benchmarks/heuristics.py --write"),
    ("HexiScale reproduction", "reproduce-hexiscale", hexiscale_repro, "python benchmarks/reproduce.py --part hexiscale"),
    ("Segment pairing (DHelix)", "pairing", pairing, "python benchmarks/pairing.py --write-readme"),
    ("DHelix reproduction", "reproduce-dhelix", dhelix_repro, "python benchmarks/reproduce.py --part dhelix"),
    ("Compiler", "compile", compiler, "python benchmarks/compile.py --write-readme"),
    ("Simulator speed", "simulator", simulator, "python benchmarks/simulator.py --write-readme"),
    ("Torch runtime overhead", "runtime", runtime, "python benchmarks/runtime.py --write-readme"),
    ("Cost-model fidelity (CPU)", "fidelity", fidelity, "python benchmarks/fidelity.py --readme"),
]


def headline_rows(text: str) -> list[str]:
    rows = ["| area | headline (parsed from that section) | section / command |", "|---|---|---|"]
    for name, tag, fn, cmd in ROWS:
        md = section(text, tag)
        if md is None:
            fig = f"— (no `{tag}` section in this README yet)"
        else:
            try:
                fig = fn(md) or "— (section present, no table of the expected shape yet)"
            except (KeyError, ValueError, IndexError) as err:  # a section changed shape: say so, do not guess
                fig = f"— (could not parse the section: {type(err).__name__} {err})"
        rows.append(f"| {name} | {fig} | `{cmd}` |")
    return rows


def headline_section(text: str, cmd: str) -> list[str]:
    return ["## Headline figures", "",
            f"Command: `{cmd}` (or `python benchmarks/summary.py` to print it). Every figure is parsed from the "
            "section named in the last column — that section's own command regenerates it; nothing is re-run "
            "here, so this table is exactly as fresh as those sections.", "",
            *headline_rows(text), ""]


if __name__ == "__main__":
    sys.stdout.write("\n".join(headline_rows(README.read_text())) + "\n")
