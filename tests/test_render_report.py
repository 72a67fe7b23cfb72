"""PLAN.md and its pictures (compiler.render.report).

The estimates below are HAND-BUILT TEST DATA (plausible magnitudes, not cost-model
output): they pin the report's structure, parsing, determinism and the drawn
pipeline bubble independently of compiler.costmodel. When the cost model and the
solver exist, ``test_real_plan_*`` also render real plans.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from markdown_it import MarkdownIt

from compiler.estimate import CommVolume, Estimate, LineItem, MemoryBreakdown, PipelineEvent, TimeBreakdown
from compiler.layout import Layout
from compiler.plan import Candidate, ClosestMiss, Plan, SearchSummary, make_plan
from compiler.render import report_text
from compiler.render.report import render_report, report_context
from compiler.render.report_svg import MAX_PIPELINE_BOXES, axis_ticks, idle_intervals
from tests.plan_fixtures import BASE_SPEC, layout_for, problem_for

SVG_NS = "{http://www.w3.org/2000/svg}"
GiB = 2**30
ABS_PATH = re.compile(r"(^|[\s(\"'=])/(home|tmp|work|usr|opt|root|Users|srv|var)\b")
SECTIONS = ["Layout", "Memory per GPU", "Step time", "Communication", "Pipeline schedule",
            "Time to train and cost", "Checkpoints and preemption", "Alternatives", "Targets", "Assumptions"]


# ------------------------------------------------------------------------------ test data
def simulate_schedule(pp: int, vpp: int, m: int, tf: float, tb: float) -> tuple[PipelineEvent, ...]:
    """TEST DATA: a greedy 1F1B-like list schedule over pp x vpp virtual stages.

    Backward first on ties; without interleaving a rank starts a new forward only while
    fewer than pp - rank microbatches are in flight on it (the 1F1B memory bound).
    """
    nv = pp * vpp
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * pp
    in_flight = [0] * pp
    todo = {(k, v, i) for i in range(m) for v in range(nv) for k in ("F", "B")}
    events = []
    while todo:
        best = None
        for k, v, i in todo:
            deps = [("F", v - 1, i)] if k == "F" and v > 0 else []
            if k == "B":
                deps = [("F", v, i)] + ([("B", v + 1, i)] if v + 1 < nv else [])
            bounded = vpp == 1 and k == "F" and in_flight[v % pp] >= pp - v % pp  # interleaved: unbounded
            if any(d not in end for d in deps) or bounded:
                continue
            start = max([free[v % pp]] + [end[d] for d in deps])
            key = (start, k != "B", i, v)
            if best is None or key < best[0]:
                best = (key, (k, v, i))
        (start, *_), (k, v, i) = best
        dur = tf if k == "F" else tb
        end[(k, v, i)] = start + dur
        free[v % pp] = start + dur
        in_flight[v % pp] += 1 if k == "F" else -1
        todo.remove((k, v, i))
        events.append(PipelineEvent(stage=v % pp, chunk=v // pp, microbatch=i, kind=k,
                                    start_s=round(start, 6), end_s=round(start + dur, 6)))
    return tuple(sorted(events, key=lambda e: (e.stage, e.start_s)))


def gpipe_schedule(pp: int, m: int, tf: float, tb: float) -> tuple[PipelineEvent, ...]:
    """TEST DATA: the closed-form GPipe schedule (all forwards, then all backwards)."""
    out = []
    for s in range(pp):
        for i in range(m):
            out.append(PipelineEvent(s, 0, i, "F", (s + i) * tf, (s + i + 1) * tf))
            b0 = (m + pp - 1) * tf + (pp - 1 - s + i) * tb
            out.append(PipelineEvent(s, 0, i, "B", b0, b0 + tb))
    return tuple(out)


def hand_estimate(layout: Layout, *, scale: float = 1.0, events: tuple[PipelineEvent, ...] | None = None
                  ) -> Estimate:
    """TEST DATA: an Estimate with plausible numbers for a 70B-class model on H100s."""
    hbm = 80 * GiB
    usable = int(hbm * 0.95)
    mem_items = (
        LineItem("weights", 17.6 * GiB, "2 B x 70.6B params / (tp 8 x pp 1)", "test data"),
        LineItem("gradients", 17.6 * GiB, "2 B x 70.6B / 8", "test data"),
        LineItem("optimizer_states", 13.2 * GiB, "12 B x 70.6B / 8 / dp_shard 8 | fp32 master+m+v",
                 "ZeRO paper, test data"),
        LineItem("activations", 9.5 * GiB * scale, "s*b*h*(10 + 24/t) x layers", "Korthikanti et al. 2022"),
        LineItem("buffers", 2.0 * GiB, "`comm` buckets + workspace", ""),
    )
    total = int(sum(i.value for i in mem_items))
    if events is None:
        events = simulate_schedule(layout.pp, layout.vpp, layout.grad_accum, 0.05, 0.1) if layout.pp > 1 else ()
    pipe_span = max((e.end_s for e in events), default=layout.grad_accum * 0.15)
    time_items = (LineItem("compute", 0.15 * layout.grad_accum * scale, "6 x N x tokens / (peak x eff)", "test"),
                  LineItem("pp_bubble", pipe_span - 0.15 * layout.grad_accum, "(p-1)/m x compute", "test"),
                  LineItem("dp_comm", 0.21, "reduce-scatter 17.6 GiB over IB", "test"),
                  LineItem("optimizer", 0.05, "adam step", "test"))
    step = sum(i.value for i in time_items)
    comm = (CommVolume("tp_all_reduce", "tp", layout.tp, "intra_node", 4.2e10, 0.9, 0.12),
            CommVolume("dp_reduce_scatter", "dp", layout.dp, "inter_node", 1.9e10, 0.6, 0.21),
            CommVolume("pp_send_recv", "pp", layout.pp, "inter_node", 3.1e8, 0.02, 0.0))
    tokens_step = layout.global_batch * 4096
    steps = 250_000
    world = layout.world_size
    return Estimate(
        memory=MemoryBreakdown(mem_items, total, hbm, usable),
        time=TimeBreakdown(time_items, step), comm=comm, pipeline=events, step_time_s=step,
        tokens_per_step=tokens_step, tokens_per_s=tokens_step / step, tokens_per_s_per_gpu=tokens_step / step / world,
        model_flops_per_token=6 * 70.6e9, model_flops_per_step=6 * 70.6e9 * tokens_step,
        hardware_flops_per_step=8 * 70.6e9 * tokens_step,
        model_tflops_per_gpu=6 * 70.6e9 * tokens_step / step / world / 1e12,
        mfu=0.4123, hfu=0.5497, pipeline_bubble_fraction=(layout.pp - 1) / (layout.grad_accum + layout.pp - 1),
        num_steps=steps, time_to_train_s=steps * step, gpu_hours=steps * step * world / 3600,
        cost_usd=steps * step * world / 3600 * 2.99, num_gpus=world,
        assumptions=("Test data: hand-built estimate.", "Efficiency 0.55 of peak for GEMMs."))


SPEC_BUDGET = """
name: report-test
description: A report test with a budget.
model:
  preset: llama3-70b
training:
  tokens: 1T
  sequence_length: 4096
  global_batch: {gbs}
cluster:
  gpu: h100-sxm
  num_gpus: 64
budget:
  max_cost: $5M
  deadline: 90d
targets: [megatron, slurm]
"""


def make_test_plan(*, pp: int = 4, vpp: int = 1, gbs: int = 32, events=None, alternatives: bool = True) -> Plan:
    problem = problem_for(SPEC_BUDGET.format(gbs=gbs))
    kw: dict[str, Any] = dict(tp=8, pp=pp, dp_shard=64 // (8 * pp), zero_stage=1)
    if vpp > 1:
        kw.update(vpp=vpp, schedule="interleaved_1f1b")
    layout = layout_for(problem, **kw)
    est = hand_estimate(layout, events=events)
    alts: tuple[Candidate, ...] = ()
    if alternatives:
        a1 = layout_for(problem, tp=8, pp=2, dp_shard=4, zero_stage=1)
        a2 = layout_for(problem, tp=4, pp=4, dp_shard=4, zero_stage=3, recompute="full")
        alts = (Candidate(a1, hand_estimate(a1, scale=2.4), 2, "12% slower: bigger | bubble"),
                Candidate(a2, hand_estimate(a2, scale=3.0), 3, "recompute costs 33% more compute"))
    search = SearchSummary(num_considered=412, num_evaluated=120, num_feasible=37, num_pruned_by_bound=55,
                           rejections_by_code={"tp_not_divisor": 98, "out_of_memory": 287,
                                               "batch_not_divisible": 27},
                           closest_misses=(ClosestMiss(layout="t8_p2_d4_z1", description="tp=8 pp=2 dp=4 zero=1",
                                                       code="out_of_memory", message="needs 83.1 GiB of 76.0 GiB",
                                                       fix="raise zero_stage", over_by=0.093),))
    return make_plan(problem, layout, est, alternatives=alts, search=search, notes=("DeepSpeed runs PP via Megatron.",))


# ------------------------------------------------------------------------------ helpers
def sections(md: str) -> list[str]:
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"]


def tables(md: str) -> list[dict[str, Any]]:
    """Every table as {section, headers, rows} (cell texts)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    out, section, current, row, in_head = [], "", None, None, False
    for i, t in enumerate(tokens):
        if t.type == "heading_open" and t.tag == "h2":
            section = tokens[i + 1].content
        elif t.type == "table_open":
            current = {"section": section, "headers": [], "rows": []}
        elif t.type == "thead_open":
            in_head = True
        elif t.type == "thead_close":
            in_head = False
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and current is not None and row is not None:
            row.append(t.content)
        elif t.type == "tr_close":
            (current["headers"].extend(row) if in_head else current["rows"].append(row))
            row = None
        elif t.type == "table_close":
            out.append(current)
            current = None
    return out


def table_with(md: str, section: str, first: str) -> dict[str, Any]:
    found = [t for t in tables(md) if t["section"] == section and t["headers"][0] == first]
    assert len(found) == 1, [(t["section"], t["headers"]) for t in tables(md)]
    return found[0]


def svg_rects(svg: str, cls: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [r for r in root.iter(SVG_NS + "rect") if cls in (r.get("class") or "").split()]


# ------------------------------------------------------------------------------ PLAN.md
@pytest.fixture(scope="module")
def plan() -> Plan:
    return make_test_plan()


@pytest.fixture(scope="module")
def files(plan: Plan) -> dict[str, str]:
    return render_report(plan)


def test_files_and_order(files: dict[str, str]) -> None:
    assert list(files) == ["PLAN.md", "memory.svg", "pipeline.svg"]
    for text in files.values():
        assert text.endswith("\n") and not text.endswith("\n\n") and "\r" not in text


def test_sections_in_order(files: dict[str, str], plan: Plan) -> None:
    md = files["PLAN.md"]
    assert md.startswith("# Training plan: report-test\n")
    assert sections(md) == SECTIONS
    assert "llama3-70b" in md and "70.55B" in md and "64 x NVIDIA H100 80GB SXM5" in md
    assert md.rstrip("\n").endswith("Generated by dtc from test.yaml -- do not edit; run: dtc compile test.yaml")


def test_layout_whys_and_batch_arithmetic(files: dict[str, str], plan: Plan) -> None:
    md = files["PLAN.md"]
    for degree in ("**tp=8**", "**pp=4**", "**dp=2**", "**zero=1**", "**micro_batch=1**", "**recompute=none**"):
        assert degree in md
    assert "inside one node" in md and "64 attention heads divide evenly (8 per GPU, 1 KV head)" in md
    assert "global batch 32 = micro 1 x accumulation 16 x dp 2" in md
    assert "runner-up `tp=8 pp=2" in md


def test_tables_have_expected_columns(files: dict[str, str]) -> None:
    md = files["PLAN.md"]
    mem = table_with(md, "Memory per GPU", "item")
    assert mem["headers"] == ["item", "bytes", "formula", "source"]
    assert [r[0] for r in mem["rows"]] == ["weights", "gradients", "optimizer_states", "activations", "buffers"]
    assert "dp_shard 8 \\| fp32" in md  # the pipe is escaped in the source ...
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<code>12 B x 70.6B / 8 / dp_shard 8 | fp32 master+m+v</code></td>" in html  # ... and rendered
    assert table_with(md, "Step time", "item")["headers"] == ["item", "time", "share", "formula", "source"]
    metrics = dict(table_with(md, "Step time", "metric")["rows"])
    assert {"MFU", "HFU", "tokens/s per GPU", "model TFLOP/s per GPU"} <= set(metrics)
    assert metrics["MFU"] == "41.2%" and metrics["HFU"] == "55.0%"
    comm = table_with(md, "Communication", "collective")
    assert comm["headers"] == ["collective", "group (size)", "link", "bytes per GPU per step", "time", "exposed"]
    assert [r[0] for r in comm["rows"]] == ["tp_all_reduce", "dp_reduce_scatter", "pp_send_recv", "**total**"]
    alt = table_with(md, "Alternatives", "rank")
    assert alt["headers"] == ["rank", "layout", "memory", "step time", "MFU", "time", "cost", "why lost"]
    assert [r[0] for r in alt["rows"]] == ["1", "2", "3"] and alt["rows"][0][-1] == "(chosen)"
    assert alt["rows"][1][-1] == "12% slower: bigger | bubble"  # escaped in the source, one cell after parsing
    assert table_with(md, "Alternatives", "considered")["rows"] == [["412", "120", "37", "55"]]
    codes = table_with(md, "Alternatives", "code")["rows"]
    assert codes == [["`out_of_memory`", "287"], ["`tp_not_divisor`", "98"], ["`batch_not_divisible`", "27"]]
    assert table_with(md, "Alternatives", "layout")["headers"] == ["layout", "code", "message", "fix"]
    cost = dict(table_with(md, "Time to train and cost", "quantity")["rows"])
    assert {"steps", "step time", "time to train", "GPU-hours", "cost"} <= set(cost)
    fw = dict(table_with(md, "Targets", "framework")["rows"])
    assert fw == {"deepspeed": "`0.19.8`", "megatron-core": "`0.19.2`", "slurm": "`22.05`", "torch": "`2.13.0`"}
    files_rows = table_with(md, "Targets", "target")["rows"]
    assert files_rows[:4] == [["plan", "`plan.json`"], ["report", "`PLAN.md`"], ["report", "`memory.svg`"],
                              ["report", "`pipeline.svg`"]]


def test_budget_headroom_and_assumptions(files: dict[str, str]) -> None:
    md = files["PLAN.md"]
    assert re.search(r"- Budget \$5\.00M: uses \$[0-9.]+K, headroom \$[0-9.]+M \([0-9.]+%\)\.", md)
    assert re.search(r"- Deadline 90\.0 d: uses [0-9.]+ (h|d|min), headroom", md)
    assert "- Test data: hand-built estimate." in md
    assert "- Memory headroom: 5.0% of HBM is kept free" in md
    assert "- DeepSpeed runs PP via Megatron." in md


def test_memory_text_chart(files: dict[str, str]) -> None:
    md = files["PLAN.md"]
    block = md.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[0] for line in block] == ["weights", "gradients", "optimizer_states", "activations",
                                                    "buffers", "total", "usable", "HBM"]
    hbm = block[-1]
    assert "█" * report_text.BAR_WIDTH in hbm and hbm.endswith("80.0 GiB")
    assert "![memory per GPU](memory.svg)" in md


def test_pipeline_section(files: dict[str, str]) -> None:
    md = files["PLAN.md"]
    assert "![pipeline](pipeline.svg)" in md
    assert "Bubble fraction (cost model): 15.8%" in md
    timeline = md.split("```text\n")[2].split("```", 1)[0].splitlines()
    assert [line.split("|")[0].strip() for line in timeline] == [f"stage {s}" for s in range(4)]
    assert timeline[0].startswith("stage 0 |FFff") and timeline[3].startswith("stage 3 |......")  # the bubble
    assert not any(line.endswith("...") for line in timeline)  # compact scale: the whole step fits
    assert "lower case for odd microbatches" in md


def test_pipeline_ascii_labelled_for_few_microbatches() -> None:
    md = render_report(make_test_plan(pp=2, gbs=8, alternatives=False))["PLAN.md"]
    timeline = md.split("```text\n")[2].split("```", 1)[0].splitlines()
    assert timeline == ["stage 0 |[F0][F1]........[B0====]....[B1====]|",
                        "stage 1 |....[F0][B0====][F1][B1====]........|"]


# ------------------------------------------------------------------------------ SVGs
def test_pipeline_svg_one_rect_per_event_and_visible_bubble(files: dict[str, str], plan: Plan) -> None:
    svg = files["pipeline.svg"]
    events = plan.estimate.pipeline
    assert len(svg_rects(svg, "ev")) == len(events) == 4 * 16 * 2
    assert len(svg_rects(svg, "F")) == len(svg_rects(svg, "B")) == 64
    idle = svg_rects(svg, "idle")
    assert idle and sum(float(r.get("width")) for r in idle) > 0
    assert not svg_rects(svg, "busy")
    texts = [t.text for t in ET.fromstring(svg).iter(SVG_NS + "text")]
    assert "stage 3" in texts and "time (s)" in texts and "idle (bubble)" in texts
    # tooltips: one per stage row, none per event (issue #15: 430 KB of tooltips)
    titles = [t.text for t in ET.fromstring(svg).iter(SVG_NS + "title")]
    assert len(titles) == 1 + 4 and titles[1].startswith("stage 0: busy ")


def test_memory_svg(files: dict[str, str], plan: Plan) -> None:
    svg = files["memory.svg"]
    items = svg_rects(svg, "item")
    assert len(items) == len(plan.estimate.memory.items)
    texts = [t.text for t in ET.fromstring(svg).iter(SVG_NS + "text")]
    assert "usable 76.0 GiB" in texts and "HBM 80.0 GiB" in texts
    widths = sum(float(r.get("width")) for r in items)
    assert 0 < widths < 960.0  # the stack stays under the HBM line


def test_interleaved_chunks_are_shaded() -> None:
    p = make_test_plan(pp=2, vpp=2, gbs=8, alternatives=False)
    svg = render_report(p)["pipeline.svg"]
    fills = {(r.get("class"), r.get("fill")) for r in svg_rects(svg, "ev")}
    assert len(fills) == 4  # F/B x even/odd chunk
    assert len(svg_rects(svg, "ev")) == len(p.estimate.pipeline) == 2 * 2 * 2 * 2
    assert "F0b" in render_report(p)["PLAN.md"]


def test_large_schedule_is_summarised_and_only_idle_is_hatched() -> None:
    events = gpipe_schedule(4, 300, 0.01, 0.02)
    p = make_test_plan(gbs=600, events=events, alternatives=False)
    out = render_report(p)
    svg = out["pipeline.svg"]
    assert len(events) == 2400 and len(events) > MAX_PIPELINE_BOXES and not svg_rects(svg, "ev")
    busy = svg_rects(svg, "busy")
    # GPipe: all forwards, then all backwards: two colours, few runs, and the stage's busy time exactly
    assert {r.get("fill") for r in busy} <= {"#4e79a7", "#f28e2b"} and len(busy) <= 4 * 4
    idle = svg_rects(svg, "idle")
    plot = 960.0
    drawn = sum(float(r.get("width")) for r in busy + idle)
    assert abs(drawn - 4 * plot) < 4 * 0.05  # busy + idle tile every row: nothing else is drawn
    assert len(svg) < 40_000
    assert "Too many events to draw one by one" in out["PLAN.md"]
    timeline = out["PLAN.md"].split("```text\n")[2].split("```", 1)[0].splitlines()
    assert all(line.endswith("| ...") for line in timeline) and "shown" in out["PLAN.md"]


def test_many_virtual_stages_read_as_three_phases() -> None:
    """Issue #15: at vpp 10 the picture was 20 near-identical legend colours and a grey band that looked like
    idle time. Now: a legend of four swatches, warm-up (forward), steady state (both), cool-down (backward)."""
    from compiler.costmodel.pp_schedule import pipeline_events

    events = pipeline_events("interleaved_1f1b", 4, 64, 10, 0.01, 0.02, 0.0)
    p = make_test_plan(pp=4, vpp=10, gbs=64, events=tuple(events), alternatives=False)
    svg = render_report(p)["pipeline.svg"]
    fills = [r.get("fill") for r in svg_rects(svg, "busy") if r.get("y") == svg_rects(svg, "busy")[0].get("y")]
    assert fills[0] == "#4e79a7" and "#8c6bb1" in fills and fills[-1] == "#f28e2b"
    texts = [t.text for t in ET.fromstring(svg).iter(SVG_NS + "text")]
    assert [t for t in texts if t and ("forward" in t or "backward" in t or "idle" in t)] == [
        "forward", "backward", "forward and backward interleaved (steady state)", "idle (bubble)"]
    assert len(svg) < 40_000


def test_single_stage_has_no_pipeline_svg() -> None:
    p = make_test_plan(pp=1, alternatives=False)
    out = render_report(p)
    assert list(out) == ["PLAN.md", "memory.svg"]
    assert "pp=1: there is no pipeline, so no bubble and no pipeline.svg." in out["PLAN.md"]
    assert "![pipeline]" not in out["PLAN.md"]
    assert sections(out["PLAN.md"]) == SECTIONS
    assert "The solver kept no alternatives." in out["PLAN.md"]


# ------------------------------------------------------------------------------ determinism
def test_byte_identical_across_renders_and_round_trip(plan: Plan, files: dict[str, str]) -> None:
    assert render_report(plan) == files
    again = Plan.from_json(plan.to_json())
    assert render_report(again) == files
    assert report_context(again) == report_context(plan)


def test_no_absolute_paths_or_timestamps(files: dict[str, str]) -> None:
    for name, text in files.items():
        assert not ABS_PATH.search(text), name
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\d\d:\d\d:\d\d", text), name


def test_absolute_spec_path_is_reduced() -> None:
    from compiler.render.common import display_path

    assert display_path("/home/me/specs/70b.yaml") == "70b.yaml"
    assert display_path("specs/70b.yaml") == "specs/70b.yaml"
    assert display_path("C:\\specs\\70b.yaml") == "70b.yaml"


def test_svgs_parse_as_xml(files: dict[str, str]) -> None:
    for name in ("memory.svg", "pipeline.svg"):
        root = ET.fromstring(files[name])
        assert root.tag == SVG_NS + "svg"


# ------------------------------------------------------------------------------ units
def test_axis_ticks_and_idle_intervals() -> None:
    ticks, unit = axis_ticks(2.4)
    assert unit == "s" and [label for _, label in ticks] == ["0.0", "0.5", "1.0", "1.5", "2.0"]
    ticks, unit = axis_ticks(0.037)
    assert unit == "ms" and ticks[1][1] == "5"
    assert idle_intervals([(1, 2), (3, 4)], 0, 5) == [(0, 1), (2, 3), (4, 5)]
    assert idle_intervals([(0, 5)], 0, 5) == []


def test_text_helpers() -> None:
    assert report_text.block_bar(1, 2, 4) == "██  "
    assert report_text.block_bar(1, 16, 4) == "▎   "
    assert report_text.code("a|b") == "`a|b`" and report_text.cell("`a|b`") == "`a\\|b`" and report_text.code("x `y`") == "`` x `y` ``"
    assert report_text.cell("a|b\nc") == "a\\|b c"


# ------------------------------------------------------------------------------ real plans
REAL_LAYOUTS = {  # spec (llama3-8b on 8 or 64 H100s) -> layout costed by the real cost model
    "pp2_1f1b": dict(tp=2, pp=2, dp_shard=2, zero_stage=1),
    "pp4_interleaved": dict(tp=2, pp=4, vpp=2, schedule="interleaved_1f1b", zero_stage=0),
    "pp1_zero3": dict(tp=1, pp=1, dp_shard=8, zero_stage=3),
}


@pytest.fixture(scope="module", params=sorted(REAL_LAYOUTS))
def real_plan(request: pytest.FixtureRequest) -> Plan:
    from tests.plan_fixtures import plan_for

    text = BASE_SPEC.format(name="real", preset="llama3-8b", seq=4096, gbs=64, gpu="h100-sxm", num_gpus=8)
    problem = problem_for(text + "targets: [megatron, slurm]\n")
    return plan_for(problem, layout_for(problem, **REAL_LAYOUTS[request.param]))


def test_real_plan_from_cost_model(real_plan: Plan) -> None:
    out = render_report(real_plan)
    md = out["PLAN.md"]
    assert sections(md) == SECTIONS
    assert len(table_with(md, "Memory per GPU", "item")["rows"]) == len(real_plan.estimate.memory.items)
    assert len(table_with(md, "Step time", "item")["rows"]) == len(real_plan.estimate.time.items)
    assert len(svg_rects(out["memory.svg"], "item")) == sum(i.value > 0 for i in real_plan.estimate.memory.items)
    if real_plan.layout.pp == 1:
        assert "pipeline.svg" not in out
    else:
        svg = out["pipeline.svg"]
        assert len(svg_rects(svg, "ev")) == len(real_plan.estimate.pipeline) > 0
        assert sum(float(r.get("width")) for r in svg_rects(svg, "idle")) > 0  # the bubble is visible
    assert render_report(Plan.from_json(real_plan.to_json())) == out == render_report(real_plan)
    for name, text in out.items():
        assert not ABS_PATH.search(text), name


def test_real_plan_from_solver() -> None:
    from compiler.solver import solve

    plan = solve(problem_for(preset="llama3-8b", num_gpus=16, gbs=128))
    out = render_report(plan)
    assert sections(out["PLAN.md"]) == SECTIONS
    ET.fromstring(out["memory.svg"])
    assert ("pipeline.svg" in out) == (plan.layout.pp > 1)
    assert render_report(Plan.from_json(plan.to_json())) == out
    alt = table_with(out["PLAN.md"], "Alternatives", "rank")
    assert len(alt["rows"]) == 1 + len(plan.alternatives)


def test_targets_table_lists_what_render_writes() -> None:
    from compiler.render.all_targets import render
    from compiler.solver import solve

    plan = solve(problem_for(preset="llama3-8b", num_gpus=16, gbs=128))
    listed = [row[1].strip("`") for row in table_with(render_report(plan)["PLAN.md"], "Targets", "target")["rows"]]
    assert listed == list(render(plan))


def test_byte_identical_across_processes_and_hash_seeds() -> None:
    import hashlib
    import subprocess
    import sys

    code = ("import hashlib; from tests.test_render_report import make_test_plan; "
            "from compiler.render.report import render_report; out = render_report(make_test_plan()); "
            "print(hashlib.sha256(repr(sorted(out.items())).encode()).hexdigest())")
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                              env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout}  # this process: random seed
    local = hashlib.sha256(repr(sorted(render_report(make_test_plan()).items())).encode()).hexdigest() + "\n"
    assert digests == {local}


def test_checkpoint_table_is_the_policy(files: dict[str, str], plan: Plan) -> None:
    """One row per framework target: compiler.checkpointing's interval, loss per failure, bytes, write time,
    signal lead and segments (what the trainers, megatron_args.sh and the sbatch scripts are rendered from)."""
    from compiler.checkpointing import plan_policy
    from compiler.units import format_bytes, format_seconds

    table = table_with(files["PLAN.md"], "Checkpoints and preemption", "target")
    assert table["headers"] == ["target", "save every", "expected loss per failure", "checkpoint", "time to write",
                                "signal lead", "segments"]
    targets = [t for t in plan.targets if t in ("megatron", "deepspeed", "fsdp")]
    assert [r[0] for r in table["rows"]] == targets and targets
    for row in table["rows"]:
        p = plan_policy(plan, row[0])
        assert row[1].startswith(format_seconds(p.interval_s)) and row[2] == format_seconds(
            p.expected_loss_per_failure_s)
        assert row[3] == format_bytes(p.checkpoint_bytes) and row[5] == f"{p.signal_lead_s} s"
