"""benchmarks/engines.py --isolate (every row in its own process, one run) and engines_goals' one-run check:
the child command lines and which runs hold every row are bookkeeping a results file depends on."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import engines  # noqa: E402
import engines_goals  # noqa: E402
from engines_cpu import ROWS  # noqa: E402


def test_without_strips_flags_in_both_spellings_and_keeps_the_rest():
    argv = "--suite cpu --rows eager,ov-int8 --isolate --name x --note=a --run 3".split()
    assert engines._without(argv, "--isolate", "--rows", "--note", "--run") == "--suite cpu --name x".split()
    # A value equal to a flag's name is still a value, not a flag.
    assert engines._without(["--note", "--rows", "--name", "y"], "--note") == ["--name", "y"]


def test_isolate_needs_a_results_name():
    try:
        engines.main(["--suite", "cpu", "--isolate", "--rows", "eager,ov-fp32"])
    except SystemExit as e:
        assert "--name" in str(e)
    else:
        raise AssertionError("--isolate without --name ran")


def _rows(run, variants):
    return [{"run": run, "variant": v, "vs_eager": 1.0} for v in variants]


def test_one_run_is_judged_on_the_runs_that_hold_every_row():
    every = [v for v in ROWS if v != "eager"]
    split = _rows(1, every[:4]) + _rows(2, every[4:])
    have = engines_goals.rows_present({256: split})[256]
    assert have["missing"] == [] and have["complete_runs"] == [] and have["runs"] == [1, 2]
    assert "no run holds every row" in engines_goals._one_run(have)
    untimed = [{"run": 3, "variant": v} for v in every]  # built but not timed: not a row of the table
    have = engines_goals.rows_present({256: split + untimed + _rows(4, ["eager", *every])})[256]
    assert have["complete_runs"] == [4]
    assert engines_goals._one_run(have) == "every row in run 4"
