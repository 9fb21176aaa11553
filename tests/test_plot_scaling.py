"""scripts/plot_scaling.py: a run given by its committed reports is read without scoring anything."""

import json

import pytest

from .conftest import load_script


plot_scaling = load_script("plot_scaling")


def _report(top1: float) -> dict:
    return {"splits": {"heldout": {"top1": [top1, top1 / 2, top1 / 3], "top8": [0.9], "acceptance_length": 1.5}}}


def test_reports_named_by_step_are_read_in_step_order(tmp_path):
    for step, top1 in ((150, 0.3), (75, 0.2), (1200, 0.5)):
        (tmp_path / f"ttt3-checkpoint-{step}.json").write_text(json.dumps(_report(top1)))
    (tmp_path / "ttt3-decayed-checkpoint-1207.json").write_text(json.dumps(_report(0.9)))  # another run's file
    template = str(tmp_path / "ttt3-checkpoint-{step}.json")
    reports = plot_scaling.template_reports(template, None)
    assert list(reports) == [75, 150, 1200]
    assert [report["splits"]["heldout"]["top1"][0] for report in reports.values()] == [0.2, 0.3, 0.5]
    assert list(plot_scaling.template_reports(template, [150])) == [150]
    with pytest.raises(SystemExit, match=r"no report for steps \[300\]"):
        plot_scaling.template_reports(template, [300])


def test_checkpoint_reports_are_read_without_scoring_and_a_missing_checkpoint_is_named(tmp_path):
    for step in (300, 600):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "diagnose").mkdir()
    for step in (300, 600):
        (tmp_path / "diagnose" / f"checkpoint-{step}.json").write_text(json.dumps(_report(step / 1000)))
    reports = plot_scaling.checkpoint_reports(tmp_path, None, diagnose_args=[])
    assert {step: report["splits"]["heldout"]["top1"][0] for step, report in reports.items()} == {300: 0.3, 600: 0.6}
    with pytest.raises(SystemExit, match=r"no checkpoint for steps \[900\] \(found \[300, 600\]\)"):
        plot_scaling.checkpoint_reports(tmp_path, [900], diagnose_args=[])
    with pytest.raises(SystemExit, match="no checkpoint for steps any"):
        plot_scaling.checkpoint_reports(tmp_path / "diagnose", None, diagnose_args=[])


def test_the_run_table_and_plot_come_from_reports_alone(tmp_path, capsys):
    for step in (75, 150):
        (tmp_path / f"run-{step}.json").write_text(json.dumps(_report(step / 500)))
    output = tmp_path / "scaling.png"
    plot_scaling.main(
        ["--run", f"run={tmp_path}/run-{{step}}.json", "--conversations-per-step", "4", "--output", str(output)]
    )
    table = capsys.readouterr().out
    assert "| run | 300 | 0.150 / 0.075 / 0.050 | 0.900 | 1.500 |" in table and "| run | 600 |" in table
    assert output.stat().st_size > 0


def test_the_ticks_stand_at_every_checkpoint_and_marker_once_and_apart():
    runs = {"a": {75: {}, 150: {}}, "b": {150: {}, 300: {}, 1200: {}}}
    points = {"decayed end": (1207 * 4, {}), "again": (600, {}), "later": (22024, {}), "last": (26357, {})}
    # 4,828 would print over 4,800, 26,357 over 22,024: the earlier tick stays
    assert plot_scaling.tick_positions(runs, 4, points) == [300, 600, 1200, 4800, 22024]
    assert plot_scaling.tick_positions({"c": {2400: {}, 3300: {}}}, 4, {}) == [9600, 13200]
