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


def test_speed_is_judged_on_the_median_run_of_the_newest_fastdiff_engine():
    def row(run, variant, ratio, snr, worst=28.0):
        return {
            "run": run,
            "variant": variant,
            "side": 256,
            "vs_eager": ratio,
            "snr_db": snr,
            "snr_db_min": worst,
        }

    timed = [
        row(1, "ov-bf16", 4.6, 30.2),
        row(3, "ov-bf16", 5.2, 30.2),
        row(4, "ov-bf16", 4.9, 30.2),
        row(5, "ov-bf16", 5.6, 30.2),
        # int8: run 1 is another build (other SNR), so only runs 2 and 6 are this engine's
        row(1, "ov-int8", 9.0, 25.0),
        row(2, "ov-int8", 5.8, 26.0),
        row(6, "ov-int8", 5.5, 26.0),
        # peers, not fastdiff engines: never "fastdiff's best", however fast
        row(5, "ov-plain-default", 7.0, 30.2),
        row(5, "eager-bf16", 8.0, 40.0),
    ]
    best, fastest = engines_goals._best_and_fastest(timed)
    # four runs: the lower middle one, not the best (5.6) and not the newest (5.6)
    assert (best["variant"], best["vs_eager"], best["run"], best["judged_runs"]) == ("ov-bf16", 4.9, 4, 4)
    assert best["runs_listed"] == "4.6x in run 1, 5.2x in run 3, 4.9x in run 4, 5.6x in run 5"
    assert (fastest["variant"], fastest["vs_eager"], fastest["judged_runs"]) == ("ov-int8", 5.5, 2)
    assert "median of this engine's 4 runs" in engines_goals._fmt(dict(best, build_s=1.0))
