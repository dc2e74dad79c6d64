"""Issue #14's goals against the CPU engine results files: each one met, not met, or not measured.

Reads ``results/engines-cpu-sd15-256.json``, ``engines-cpu-sd15-512.json``, ``engines-cpu-memory.json``
and ``engines-tiny-e2e.json`` (written by ``engines.py --suite cpu``, ``engines_memory.py`` and
``engines_tiny_e2e.py``) and writes ``results/engines-cpu-goals.{json,md}``. Nothing is measured here.

Where a ``-avx512`` file exists (``engines-cpu-sd15-256-avx512.json``, ...: measured on an EPYC with
AVX-512, VNNI and AVX512-BF16) the goals are judged on it; the AVX2-only machine's file stays as an
"earlier machine" line (its speed-ups are that machine's, not this one's).
Machines in ``OTHER_MACHINES`` (the AMX Xeon's ``-amx`` files) are judged apart, each on its own files.

    python benchmarks/engines_goals.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, env_info, write_results  # noqa: E402

from fastdiff.engines.cpu import engine_flags, has_bf16, has_vnni  # noqa: E402

AVX512 = "-avx512"  # results measured on the AVX-512/VNNI/BF16 machine


PYTORCH_ROUTE = "2a2606c"  # the commit that made int8 convert the PyTorch U-Net directly
MAX_LOAD = 3.0  # 1-minute load average above which a run's speed ratios are left out (2-core machine)


# Whole OpenVINO int8 builds at 512^2 with 32 records, profiled stage by stage (engines_build_profile.py).
OV_WHOLE_512_PROFILES = (
    ("engines-cpu-build-profile-ov-int8-512-32-nosq", "with smooth_quant=False, statistics at f32"),
    (
        "engines-cpu-build-profile-ov-int8-512-32-bf16stats",
        "with NNCF's statistics at the engine's bf16 hint (SmoothQuant on)",
    ),
    (
        "engines-cpu-build-profile-ov-int8-512-32-trim",
        "with the defaults of 2026-12-06: that, and the C heap's free pages given back between NNCF's passes and records",
    ),
    (
        "engines-cpu-build-profile-ov-int8-512-32-trim-nosq",
        "with those defaults but QuantConfig(smooth_quant=False)",
    ),
    (
        "engines-cpu-build-profile-ov-int8-512-32-avx2",
        "with those defaults on the AVX2-only machine (no native bf16: statistics and engine at f32)",
    ),
    (
        "engines-cpu-build-profile-ov-int8-512-32-rowsamples",
        "with each row of a guidance pair a separate NNCF sample (6992d6c, replaced: narrower ranges, "
        "fastdiff-tiny -1.4 / -2.1 points)",
    ),
    (
        "engines-cpu-build-profile-ov-int8-512-32-whole",
        "with whole records (statistics_batch=None), measured beside the defaults now",
    ),
    (
        "engines-cpu-build-profile-ov-int8-512-32-f32stats-whole",
        "with statistics at f32, as on a CPU without native bf16, whole records (family-26 machine)",
    ),
    (
        "engines-cpu-build-profile-ov-int8-512-32-f32stats-rows1",
        "with statistics at f32, as on a CPU without native bf16, one row at a time (family-26 machine)",
    ),
)
# The whole default compile_engine int8 build at 512^2 with 32 records that judges the OpenVINO memory goal:
# the defaults now (statistics one row of a guidance pair at a time, NNCF given each record's statistics).
OV_DEFAULT_512_PROFILE = (
    "engines-cpu-build-profile-ov-int8-512-32-rows1",
    "the defaults now: NNCF's statistics one row of a guidance pair at a time (statistics_batch=1)",
)


def _load(name):
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _current(name):
    """``name`` + "-avx512" where that file exists (judged first), else ``name`` (the AVX2 machine)."""
    return name + AVX512 if _load(name + AVX512) else name


def _sd15_name(side):
    """The SD1.5 file judged at ``side``: the AVX-512 machine's as soon as it measured either side (a side
    it did not measure has no rows: the AVX2 machine's speed-ups are not mixed into its judgment)."""
    if any(_load(f"engines-cpu-sd15-{s}{AVX512}") for s in (256, 512)):
        return f"engines-cpu-sd15-{side}{AVX512}"
    return f"engines-cpu-sd15-{side}"


def _sd15_rows(side, name=None):
    data = _load(name or _sd15_name(side))
    return [r for r in (data or {}).get("rows", []) if r["variant"] != "eager"]


def _flags(name):
    data = _load(name) or {}
    return data.get("meta", {}).get("cpu_engine_flags") or []


QUANTISED_VARIANTS = ("ov-int8", "ov-mixed", "ort-int8")  # the variants the build goal judges


def _fresh_builds(rows: list[dict]) -> tuple[list[dict], dict[str, dict]]:
    """The fresh (not cached) builds among ``rows``, and the newest one per variant."""
    built = [r for r in rows if not r.get("cache_hit") and "build_s" in r]
    return built, {r["variant"]: r for r in sorted(built, key=lambda r: r["run"])}


def _best_and_fastest(timed: list[dict]) -> tuple[dict | None, dict | None]:
    """fastdiff's fastest engine at >= 30 dB and its fastest of any SNR. A variant timed in several runs is judged
    by the median ratio (the lower middle one of an even count) over the runs of its newest engine: the
    runs whose SNR on the held-back records (mean and worst) equals the newest run's, i.e. the same build
    judged on the same records; a rebuild with other defaults starts a new group. One engine's ratio moves
    by up to 13 % between runs on these shared machines, mostly because eager's step does
    (engines-cpu-sd15-256-amx run 7: eager 2.05-2.77 s across its row processes), so
    neither the best nor the newest run alone says what a user gets. The rule was fixed on 2026-12-08
    before engines-cpu-sd15-256-amx runs 5-7 (benchmarks README). Every run's ratio is listed with it
    (a file's runs may come from several machines: its notes say which)."""
    # the peers (eager, eager-bf16, torch.compile, plain OpenVINO) are not fastdiff's engines
    from engines_cpu import BASELINE_ROWS

    runs: dict[tuple, list[dict]] = {}
    for r in sorted(timed, key=lambda r: r.get("run", 0)):
        if r["variant"] in BASELINE_ROWS:
            continue
        runs.setdefault((r["variant"], r["side"]), []).append(r)
    rows = []
    for rs in runs.values():
        snr = (rs[-1]["snr_db"], rs[-1].get("snr_db_min"))
        same = [r for r in rs if (r["snr_db"], r.get("snr_db_min")) == snr]
        middle = sorted(same, key=lambda r: r["vs_eager"])[(len(same) - 1) // 2]
        listed = ", ".join(f"{r['vs_eager']}x in run {r['run']}" for r in rs)
        rows.append(dict(middle, runs_listed=listed if len(rs) > 1 else "", judged_runs=len(same)))
    best = max((r for r in rows if r["snr_db"] >= 30), key=lambda r: r["vs_eager"], default=None)
    return best, max(rows, key=lambda r: r["vs_eager"], default=None)


def _earlier_builds() -> str:
    """The AVX2 machine's newest fresh quantised builds at 256^2, when the AVX-512 file is the one judged."""
    if not _sd15_name(256).endswith(AVX512):
        return ""
    _, latest = _fresh_builds(_sd15_rows(256, "engines-cpu-sd15-256"))
    q = [r for k, r in latest.items() if k in QUANTISED_VARIANTS]
    return "".join(f"; earlier machine (AVX2 only, engines-cpu-sd15-256): {_build_fmt(r)}" for r in q)


# Reruns of the judged AVX-512 file's rows, oldest first (each with its own eager row); a later one's rows
# replace the earlier figures of the same variant.
TINY_RERUNS = {
    "-bf16": "after the fix of 2adca0b (the replaced ov-bf16 was built after ov-fp32 in one OpenVINO blob cache: "
    "the bug that commit fixed)",
    "-int8-bf16hint": "with int8's bf16 hint (the default since 2026-12-05), eager, bf16 and int8 in one process",
    "-bf16stats": "with NNCF's statistics at the engine's hint and mixed's sensitivity on OpenVINO (the defaults "
    "since 2026-12-06), eager, int8 and mixed in one process (the test suite shared the CPU: speed not judged)",
}


def _tiny_rerun(tiny_name, suffix):
    data = _load(tiny_name + suffix) if tiny_name.endswith(AVX512) else None
    ok = data and any(r["variant"] == "eager" and r.get("n") == 144 for r in data["rows"])
    return data if ok else None


# The AVX2 machine's tiny end-to-end files, quoted beside the AVX-512 machine's judged one. The 576-image
# run was decided on before it ran (2026-12-07) as the AVX2 machine's judged figure: at 144 images the
# paired interval is about +/- 3-4 points, wider than the 2-point goal.
AVX2_TINY_576 = "engines-tiny-e2e-avx2-576"
AVX2_TINY = {
    "engines-tiny-e2e": "earlier machine (AVX2 only, engines-tiny-e2e)",
    "engines-tiny-e2e-avx2-overflow": "AVX2 only with the defaults of 2026-12-06 (int8: 7-bit weights without "
    "VNNI, QuantConfig.overflow_fix), engines-tiny-e2e-avx2-overflow",
    AVX2_TINY_576: "AVX2 only, the same defaults on 576 images (72 held-out combinations x 8 seeds; the paired "
    "95 % interval of the points in brackets), " + AVX2_TINY_576,
}


def _points(data) -> dict[str, float]:
    """Each variant's 'all' accuracy against the same file's eager row, in points (to 0.1)."""
    base = next(r for r in data["rows"] if r["variant"] == "eager")
    return {r["variant"]: round(100 * (r["all"] - base["all"]), 1) for r in data["rows"] if r is not base}


def _earlier_tiny(tiny_name) -> str:
    """The AVX2 machine's tiny end-to-end points, when the AVX-512 file is the one judged."""
    out = ""
    for name, label in AVX2_TINY.items():
        old = _load(name) if tiny_name.endswith(AVX512) else None
        if not old:
            continue
        ci95 = {r["variant"]: f" [{r['ci95']}]" for r in old["rows"] if "ci95" in r}
        out += f"; {label}: " + ", ".join(f"{v} {d:+.1f}{ci95.get(v, '')}" for v, d in _points(old).items())
    return out


def _within_two(diffs: dict) -> str:
    return "; ".join(
        f"{label}: {', '.join(k for k, d in diffs.items() if (abs(d) <= 2) == want)}"
        for label, want in (("met", True), ("not met", False))
        if any((abs(d) <= 2) == want for d in diffs.values())
    )


# The AVX-512 machine's 576-image run (the same 72 combinations x 8 seeds), decided on before it ran
# (2026-12-07 13:40 UTC) as that machine's judged figure, for the AVX2 run's reason: the 144-image
# judgment (int8 +4.2 points) has a paired interval wider than the 2-point goal. The 144-image rows stay
# in the evidence.
AVX512_TINY_576 = "engines-tiny-e2e-avx512-576"


def _within_two_576(tiny_name) -> str:
    """The 576-image judgments: the AVX-512 machine's (when run) in place of its 144-image one, and the
    AVX2 machine's beside it."""
    if not tiny_name.endswith(AVX512):
        return ""
    wide, avx2 = _load(AVX512_TINY_576), _load(AVX2_TINY_576)
    out = " (AVX-512, 144 images)" if not wide else ""
    if avx2:
        out += f"; AVX2 only, 576 images: {_within_two(_points(avx2))}"
    return out


def _avx512_576() -> tuple[str, str]:
    """(status, evidence) of the AVX-512 576-image run, or empty strings before it exists."""
    wide = _load(AVX512_TINY_576)
    if not wide:
        return "", ""
    base = next(r for r in wide["rows"] if r["variant"] == "eager")
    ci95 = {r["variant"]: f" [{r['ci95']}]" for r in wide["rows"] if "ci95" in r}
    points = _points(wide)
    return (
        f"AVX-512, 576 images: {_within_two(points)}",
        f"({AVX512_TINY_576}, the judged AVX-512 figure, decided before it ran; the paired 95 % interval in "
        f"brackets) eager fp32 'all' {base['all']:.3f}; points vs eager: "
        + ", ".join(f"{v} {d:+.1f}{ci95.get(v, '')}" for v, d in points.items())
        + "; before it, on 144 images: ",
    )


def _hint_pair(side) -> str:
    data = _load(f"engines-cpu-int8-hint-sd15-full-{side}")
    if not data:
        return ""
    rows = {r["variant"]: r for r in data["rows"]}
    f32, bf16 = rows.get("int8, f32 hint"), rows.get("int8, bf16 hint")
    return (
        f"at {side}^2 f32 {f32['vs_eager']}x at {f32['snr_db']} dB, bf16 {bf16['vs_eager']}x at {bf16['snr_db']} dB"
        if f32 and bf16
        else ""
    )


def _ort_memory(rows: dict) -> str:
    """ONNX Runtime int8 whole builds (fresh, not cached): process peaks, for the same memory goal."""
    builds = [
        (side, r)
        for side in (256, 512)
        for r in rows[side]
        if r["variant"] == "ort-int8" and not r.get("cache_hit") and "peak_rss_gb" in r
    ]
    if not builds:
        return ""
    return (
        "; ONNX Runtime int8, whole builds (4 records): "
        + ", ".join(
            f"{side}^2 run {r['run']} {r['peak_rss_gb']} GB{_built_after(rows[side], r)}"
            for side, r in builds
        )
        + (
            " (from run 13 at 256^2 and run 6 at 512^2: fastdiff's grouped calibration, 854198b; before it ONNX "
            "Runtime's own calibrator held every calibrated tensor of a record at once, and at 512^2 the process "
            "passed 22.7 GB on the first record and was killed by a watchdog on this 24 GB machine; from run 14 at "
            "256^2 it calibrates only the tensors quantised layers read, c61863c; from run 17 the export and ORT's "
            "pre-processing stream the weights instead of loading them in Python, ae394cd)"
        )
        + _ort_profiles_512()
    )


def _built_after(rows: list, row: dict) -> str:
    """Which engines the same run built before ``row`` (their memory is in its process peak)."""
    earlier = []
    for r in rows:
        if r is row:
            break
        if r["run"] == row["run"] and r["variant"] != "eager":
            earlier.append(r["variant"])
    return f" (after {', '.join(earlier)} in the same process)" if earlier else ""


def _ort_profiles_512() -> str:
    """The 512^2 ONNX Runtime int8 build profiles: where the peak is, before and after each memory change."""
    found = []
    for name, what in (
        ("engines-cpu-build-profile-ort-int8-512", "profile with the memory arena on"),
        ("engines-cpu-build-profile-ort-int8-512-noarena", "with the calibration sessions' arena off"),
        (
            "engines-cpu-build-profile-ort-int8-512-lean",
            "calibrating only what quantised layers read, in correctly sized groups",
        ),
        (
            "engines-cpu-build-profile-ort-int8-512-fast",
            "with the streaming export and pre-processing as well",
        ),
        (
            "engines-cpu-build-profile-ort-int8-512-persample",
            "calibrating one sample at a time (the two classifier-free guidance halves apart)",
        ),
        (
            "engines-cpu-build-profile-ort-int8-512-shared",
            "and on the caller's U-Net weights instead of a second copy, without pre-packing (the default now)",
        ),
        ("engines-cpu-build-profile-ort-int8-512-32", "the default now with 32 records"),
    ):
        path = RESULTS_DIR / f"{name}.json"
        if path.exists():
            m = json.loads(path.read_text())["meta"]
            found.append(
                f"{what}: {m['peak_rss_gb']} GB peak in {m['peak_stage'].split(' > ')[-1]}, "
                f"build {m['total_without_quality_check_s']:.0f} s, SNR {m['quality']['snr_db']:.2f} dB ({name}.md)"
            )
    return "; 512^2 " + "; ".join(found) if found else ""


def ort_whole_build_32() -> dict | None:
    """The 512^2 ONNX Runtime int8 compile_engine profile that calibrated 32 records, if there is one."""
    import re

    data = _load("engines-cpu-build-profile-ort-int8-512-32")
    if not data:
        return None
    most = re.search(r"at most (\d+) calibrate", data["notes"])
    calibrated = min(data["meta"]["records"]["calibrate"], int(most.group(1))) if most else 0
    return {**data["meta"], "calibrated": calibrated} if calibrated >= 32 else None


def rows_present(rows_by_side: dict) -> dict:
    """Which of the benchmark's rows each side's judged file holds (timed), and which it lacks."""
    from engines_cpu import ROWS

    out = {}
    for side, rows in rows_by_side.items():
        timed = [r for r in rows if "vs_eager" in r]
        have = {r["variant"] for r in timed}
        wanted = {v for v in ROWS if v != "eager"}
        by_run: dict[int, set] = {}
        for r in timed:
            by_run.setdefault(r["run"], set()).add(r["variant"])
        out[side] = {
            "present": [v for v in ROWS if (v == "eager" and have) or v in have],
            "missing": [v for v in ROWS if v != "eager" and v not in have],
            # The issue asks for every row "in one run": the runs holding all of them.
            "complete_runs": sorted(run for run, vs in by_run.items() if wanted <= vs),
            "runs": sorted(by_run),
        }
    return out


def _one_run(have: dict) -> str:
    if have["complete_runs"]:
        return f"every row in run {have['complete_runs'][-1]}"
    return f"no run holds every row (rows from runs {', '.join(map(str, have['runs']))})"


def _fmt(r):
    hit = " (cache hit)" if r.get("cache_hit") else ""
    runs = ""
    if r.get("runs_listed"):
        n = r["judged_runs"]
        which = f"median of this engine's {n} runs" if n > 1 else "this engine's only run"
        runs = f" ({which}, run {r['run']}; every run: {r['runs_listed']})"
    worst = f" (worst record {r['snr_db_min']} dB)" if r.get("snr_db_min") is not None else ""
    return f"{r['variant']} {r['vs_eager']}x{runs} at {r['snr_db']} dB{worst}, build {r['build_s']} s{hit}"


def _build_fmt(r):
    if r["variant"].startswith("ov-plain"):
        split = " (openvino.convert_model + compile, no quality check)"
    elif r["variant"] in ("compile", "eager-bf16"):  # PyTorch peers: torch.compile's wrap, the bf16 cast
        split = " (the peer's own setup, no compile_engine)"
    elif "build_without_quality_s" in r:
        split = f" = {r['build_without_quality_s']} s build + {r['quality_check_s']} s quality check"
    else:
        split = " (includes compile_engine's quality check on the held-back records)"
    settings = ""
    if "smooth_quant" in r:  # OpenVINO int8/mixed rows record their NNCF settings
        settings = f", smooth_quant={r['smooth_quant']}, bias_correction={r.get('bias_correction')}"
    return f"{r['variant']} {r['build_s']} s{split} (run {r['run']}, load {r['load_1min']}{settings})"


def _blob_cache_starts() -> str:
    """Cached OpenVINO starts with the default blob_cache='off' and with OpenVINO's blob cache
    (engines_blob_cache.py: fresh processes through the first U-Net call)."""
    data = _load("engines-blob-cache")
    if not data:
        return ""
    rows = {(r["side"], r["precision"], r["blob_cache"], r["start"]): r for r in data["rows"]}
    parts = []
    for (side, precision, mode, start), r in sorted(rows.items()):
        if mode != "off" or start != "warm":
            continue
        full = rows.get((side, precision, "full", start))
        parts.append(
            f"{precision} at {side}^2: compile_engine {r['cache_hit_s']} s + first call {r['first_call_s']} s "
            f"(a step: {r['second_call_s']} s)"
            + (
                f", with OpenVINO's blob cache {full['cache_hit_s']} s + {full['first_call_s']} s"
                if full
                else ""
            )
        )
    rerun = [r for r in (_load("engines-blob-cache-512-reps4") or {}).get("rows", []) if r["start"] == "warm"]
    again = [
        f"{r['precision']} at {r['side']}^2 {r['blob_cache']} {r['to_first_image_step_s']} s "
        f"({r['to_first_min_s']}-{r['to_first_max_s']})"
        for r in rerun
    ]
    return (
        "; cached starts with the default blob_cache='off' (engines-blob-cache, AMX Xeon, fresh process, files in "
        "the page cache): "
        + "; ".join(parts)
        + (
            f"; rerun with {rerun[0]['n']} warm starts each, to the end of the first call (engines-blob-cache-512-reps4): "
            + ", ".join(again)
            if again
            else ""
        )
    )


def goals(not_run: dict) -> list[dict]:
    rows = {side: _sd15_rows(side) for side in (256, 512)}
    out = []
    timed = [dict(r, side=s) for s, rs in rows.items() for r in rs if "vs_eager" in r]
    # A run at load > MAX_LOAD (2 cores) was contended by other jobs: its ratios are not speed evidence.
    fresh = [r for r in timed if r.get("load_1min", 0) <= MAX_LOAD]
    contended = sorted(
        {f"run {r['run']} at {r['side']}^2 (load {r['load_1min']})" for r in timed if r not in fresh}
    )
    best, fastest = _best_and_fastest(fresh)
    files = ", ".join(_sd15_name(side) for side in (256, 512) if _load(_sd15_name(side)))
    earlier = ""
    if any(_sd15_name(side).endswith(AVX512) for side in (256, 512)):
        old = [
            dict(r, side=s)
            for s in (256, 512)
            for r in _sd15_rows(s, f"engines-cpu-sd15-{s}")
            if "vs_eager" in r
        ]
        old_best, old_fast = _best_and_fastest(old)
        if old_best or old_fast:
            earlier = "; earlier machine (AVX2 only, engines-cpu-sd15-{256,512}): " + "; ".join(
                f"{label} {_fmt(r)} at {r['side']}^2"
                for label, r in (("best at >= 30 dB", old_best), ("fastest", old_fast))
                if r
            )
    out.append(
        {
            "goal": "best CPU engine >= 5x eager fp32 per U-Net step at >= 30 dB (full SD1.5 U-Net)",
            "status": "met" if best and best["vs_eager"] >= 5 else "not met",
            "evidence": f"({files}) "
            + (f"best at >= 30 dB: {_fmt(best)} at {best['side']}^2" if best else "no row >= 30 dB")
            + (f"; fastest of any SNR: {_fmt(fastest)} at {fastest['side']}^2" if fastest else "")
            + (f"; not judged for speed (contended): {', '.join(contended)}" if contended else "")
            + earlier,
        }
    )
    tiny_name = _current("engines-tiny-e2e")
    tiny = _load(tiny_name)
    if tiny and any(r["variant"] == "eager" and r.get("n") == 144 for r in tiny["rows"]):
        base = next(r for r in tiny["rows"] if r["variant"] == "eager")
        diffs = _points(tiny)
        superseded = ""
        for suffix, why in TINY_RERUNS.items():
            rerun = _tiny_rerun(tiny_name, suffix)
            if not rerun:
                continue
            # A rerun's rows replace the earlier rows of the same variant (points against the rerun's own
            # eager row); the replaced figures stay in the evidence.
            rbase = next(r for r in rerun["rows"] if r["variant"] == "eager")
            new = _points(rerun)
            was = {v: diffs.get(v) for v in new}
            replaced = [f"{v} {'none' if d is None else f'{d:+.1f}'}" for v, d in was.items()]
            diffs.update(new)
            superseded += (
                f"; rerun {why} ({tiny_name}{suffix}, eager 'all' {rbase['all']:.3f}) replaces "
                f"{', '.join(replaced)}"
            )
        wide_status, wide_evidence = _avx512_576() if tiny_name.endswith(AVX512) else ("", "")
        out.append(
            {
                "goal": "fastdiff-tiny end to end within 2 points of fp32 attribute accuracy ('all', at least 144 images)",
                "status": (wide_status or _within_two(diffs)) + _within_two_576(tiny_name),
                "evidence": wide_evidence
                + f"({tiny_name}) eager fp32 'all' {base['all']:.3f}; points vs eager: "
                + ", ".join(f"{k} {v:+.1f}" for k, v in diffs.items())
                + superseded
                + _earlier_tiny(tiny_name),
            }
        )
    else:
        out.append({"goal": "fastdiff-tiny within 2 points", "status": "not measured", "evidence": ""})
    built, latest = _fresh_builds(rows[256])
    q = [r for r in latest.values() if r["variant"] in QUANTISED_VARIANTS]
    under = [r["variant"] for r in q if r["build_s"] < 120]
    under_without = [
        r["variant"] for r in q if r["build_s"] >= 120 and r.get("build_without_quality_s", 1e9) < 120
    ]
    over = [r["variant"] for r in q if r["variant"] not in under + under_without]
    # An earlier fresh build of a variant under 120 s with other (recorded) settings: a documented option.
    options = {
        v: min(
            (r for r in built if r["variant"] == v and r["build_s"] < 120),
            key=lambda r: r["build_s"],
            default=None,
        )
        for v in over
    }
    status = "not measured"
    if q and not over and not under_without:
        status = "met"
    elif q:  # per quantised variant: the goal names fastdiff's int8 build, the variants differ
        status = "; ".join(
            part
            for part in (
                f"met: {', '.join(under)}" if under else "",
                f"met without the quality check: {', '.join(under_without)}" if under_without else "",
                f"not met: {', '.join(over)}" if over else "",
                *(
                    f"{v} under 120 s in an earlier fresh build: run {r['run']}, {r['build_s']} s"
                    + (f" on {r['quantize_records']} records" if "quantize_records" in r else "")
                    + (
                        " with smooth_quant=False (not the default: it costs SNR on trained weights)"
                        if r.get("smooth_quant") is False
                        else ""
                    )
                    + (
                        f" (run {latest[v]['run']}: {latest[v]['quantize_records']} records)"
                        if "quantize_records" in latest[v]
                        else ""
                    )
                    for v, r in options.items()
                    if r is not None
                ),
            )
            if part
        )
    out.append(
        {
            "goal": "build (export + calibration + quantisation + compile) < 120 s, full SD1.5 U-Net at 256^2",
            "status": status,
            "evidence": f"({_sd15_name(256)}) "
            + "; ".join(_build_fmt(r) for r in latest.values())
            + "".join(
                f"; earlier: {r['variant']} {r['build_s']} s (run {r['run']})"
                for r in built
                if latest[r["variant"]] is not r
            )
            + _earlier_builds(),
        }
    )
    cached = [dict(r, side=side) for side in (256, 512) for r in rows[side] if r.get("cache_hit")]
    mem = (_load("engines-cpu-memory") or {}).get("rows", [])
    # Rows with "verify" come from cache format 2 (#14's cheaper checks); earlier ones are history.
    hits = [m for m in mem if m.get("cache_hit") and m.get("verify") == "stat"]
    before = [m for m in mem if m.get("cache_hit") and "verify" not in m]
    out.append(
        {
            "goal": "cached rebuild < 10 s",
            "status": "not measured"
            if not hits and not cached
            else "met"
            if all(m["compile_engine_s"] < 10 for m in hits) and all(r["build_s"] < 10 for r in cached)
            else "not met",
            "evidence": "; ".join(
                f"{m['precision']} at {m['side_px']}^2, fresh process, load {m['load_1min']}: compile_engine "
                f"{m['compile_engine_s']} s (weights fingerprint {m['weights_fingerprint_s']} s, cache check "
                f"{m['cache_check_s']} s, reading the model {m['read_model_s']} s), {m['through_first_step_s']} s "
                "through the first step (per-shape compile from OpenVINO's blob cache + one U-Net step)"
                for m in hits
            )
            + "".join(
                f"; before (cache format 1): {m['compile_engine_s']} s at {m['side_px']}^2" for m in before
            )
            + "".join(
                f"; {r['variant']} at {r['side']}^2 (engines.py run {r['run']}, fresh process, load {r['load_1min']}): "
                f"compile_engine {r['build_s']} s, {r['first_call_s']} s more through the first step"
                for r in cached
            )
            + _blob_cache_starts(),
        }
    )
    at512 = [m for m in mem if m.get("records") == 32 and m.get("side_px") == 512 and "peak_rss_gb" in m]
    ort_stages = [m for m in at512 if "(ONNX Runtime)" in m.get("what", "")]
    stages = [m for m in at512 if m not in ort_stages]  # NNCF's
    current = [m for m in stages if m.get("mapped_weights")]  # this round's code path (#14 fixes)
    judged = current or stages
    # Whole compile_engine int8 builds (defaults) at 512^2: the benchmark process's peak. Fewer than 32
    # records can show the goal missed (NNCF's memory does not shrink with more records), not met.
    whole = [r for r in rows[512] if r["variant"] == "ov-int8" and r.get("quantize_records")]
    if all(r["quantize_records"] < 32 for r in whole) and all(r["peak_rss_gb"] < 8 for r in whole):
        whole = []
    out.append(
        {
            "goal": "peak memory < 8 GB for int8 calibration + quantisation at 512^2 with 32 records",
            "status": (
                "OpenVINO: "
                + (
                    f"{'met' if judged_ov['peak_rss_gb'] < 8 else 'not met'} for a whole default int8 build "
                    f"({OV_DEFAULT_512_PROFILE[1]}: {judged_ov['peak_rss_gb']} GB, 32 records, build "
                    f"{judged_ov['total_without_quality_check_s']} s, SNR {judged_ov['quality']['snr_db']:.2f} dB, "
                    f"{OV_DEFAULT_512_PROFILE[0]}); earlier"
                    if (judged_ov := (_load(OV_DEFAULT_512_PROFILE[0]) or {}).get("meta"))
                    else ("met" if all(r["peak_rss_gb"] < 8 for r in whole) else "not met")
                    + " for a whole default int8 build"
                )
                + "".join(
                    f" ({'met' if prof['peak_rss_gb'] < 8 else 'not met'} {what}: {prof['peak_rss_gb']} GB, "
                    f"32 records, {name})"
                    for name, what in OV_WHOLE_512_PROFILES
                    if (prof := (_load(name) or {}).get("meta"))
                )
                + "; stage alone: "
                if whole
                else ""
            )
            + (
                "not measured"
                if not judged
                # the stage alone, SmoothQuant off, like the earlier row; not a whole compile_engine call,
                # which also holds the PyTorch U-Net (see the notes)
                else "met (SmoothQuant off)"
                if whole
                else "met for the stage alone (SmoothQuant off; a whole compile_engine int8 build not measured)"
                if all(m["peak_rss_gb"] < 8 and m.get("finished", True) for m in judged)
                else "not met"
                if any(m["peak_rss_gb"] >= 8 for m in judged)
                else "not measured (unfinished run below 8 GB so far)"
            )
            + "".join(
                f"; ONNX Runtime stage alone: {'met' if m['peak_rss_gb'] < 8 else 'not met'}"
                for m in ort_stages[-1:]
            )
            + (
                f"; ONNX Runtime whole default int8 build (PyTorch U-Net in the process, {ort32['calibrated']} "
                f"records): {'met' if ort32['peak_rss_gb'] < 8 else 'not met'} ({ort32['peak_rss_gb']} GB)"
                if (ort32 := ort_whole_build_32())
                else ""
            ),
            "evidence": "".join(
                f"whole build ({_sd15_name(512)} run {r['run']}, {r['quantize_records']} records, "
                "compile_engine defaults: PyTorch U-Net in "
                f"the process, direct conversion, smooth_quant={r.get('smooth_quant')}, bias_correction="
                f"{r.get('bias_correction')}): {r['peak_rss_gb']} GB peak over the build, first call and "
                f"quality check; {r.get('quantize_peak_rss_gb')} GB peak in the NNCF call; build {r['build_s']} s; "
                for r in whole
            )
            + "stage alone: "
            + "; ".join(
                ("before: " if m not in current and current else "")
                + (
                    f"{m['peak_rss_gb']} GB peak (anon {m.get('peak_anon_gb')}, mapped file "
                    f"{m.get('peak_file_gb')}; ru_maxrss {m.get('ru_maxrss_gb')}) in {m['seconds']} s, "
                    f"calibration shapes {m.get('calibration_shapes')}, mapped weights {m.get('mapped_weights')}, "
                    f"SNR vs fp32 on held-back records mean {m.get('snr_vs_fp32_db_mean')} / worst "
                    f"{m.get('snr_vs_fp32_db_worst')} dB"
                    if m.get("finished", True)
                    else f">= {m['peak_rss_gb']} GB (a lower bound: reached after {m['peak_reached_at_s']:.0f} s "
                    f"and flat until the run was cut at {m['seconds']:.0f} s, before NNCF finished)"
                )
                + f" (smooth_quant={m['smooth_quant']}; {m['record_kind']})"
                for m in stages
            )
            + _ort_memory(rows)
            + "".join(
                f"; ONNX Runtime stage alone (engines_memory.py ort-stage, 32 records, {m['record_kind']}): "
                f"{m['peak_rss_gb']} GB peak (anon {m['peak_anon_gb']}, mapped file {m['peak_file_gb']}) in "
                f"{m['seconds']} s, SNR vs fp32 on held-back records mean {m.get('snr_vs_fp32_db_mean')} / worst "
                f"{m.get('snr_vs_fp32_db_worst')} dB"
                for m in ort_stages
            ),
        }
    )
    avx2 = rows_present({s: _sd15_rows(s, f"engines-cpu-sd15-{s}") for s in (256, 512)})
    for side, have in rows_present(rows).items():
        name = _sd15_name(side)
        if have["missing"]:
            status = "missing: " + ", ".join(have["missing"])
        else:
            status = "all present, in one run" if have["complete_runs"] else "all present, not in one run"
        earlier = ""
        if name.endswith(AVX512):
            earlier = f"; earlier machine (AVX2 only, engines-cpu-sd15-{side}): " + _one_run(avx2[side])
        out.append(
            {
                "goal": f"rows at {side}^2 in one run ({name})",
                "status": status,
                "evidence": "present: "
                + (", ".join(have["present"]) or "none")
                + f"; {_one_run(have)}"
                + (f"; missing rows: {not_run[side]}" if have["missing"] and side in not_run else "")
                + earlier,
            }
        )
    return out


# Machines judged apart from the AVX-512 EPYC files above, by results-file suffix: each machine's ratios are
# measured against its own eager rows, so they are judged per machine, never pooled with another's.
OTHER_MACHINES = {
    "-amx": "Intel Xeon with AMX (amx_bf16, amx_int8, avx512_bf16)",
}


def _bf16_islands(machine: str | None) -> str:
    """Why int8 mixed into bf16 does not reach 30 dB, where engines_bf16_islands.py ran on ``machine``
    (cpu family/model): each class of operations kept in f32 under the bf16 hint, its SNR gain and speed."""
    data = _load("engines-bf16-islands")
    if not data or machine is None or data["meta"].get("cpu_family_model") != machine:
        return ""
    rows = {r["f32 island"]: r for r in data["rows"]}
    base = rows["none (bf16)"]
    parts = [
        f"{name} {r['snr_mean_db'] - base['snr_mean_db']:+.2f} dB at {r['vs_eager']}x "
        f"(f32 kernels {100 * r['f32_kernel_share']:.0f} % of the time)"
        if "snr_mean_db" in r
        else f"{name}: OpenVINO refused ({r['error']})"
        for name, r in rows.items()
        if name not in ("none (bf16)", "f32 hint (reference speed)")
    ]
    return (
        f"; bf16's error is spread over the network (engines-bf16-islands, {data['meta']['held_records']} held-back "
        f"records: bf16 {base['snr_mean_db']} dB mean, {base['snr_worst_db']} dB worst, {base['vs_eager']}x timed back to "
        "back there): keeping "
        "one class of operations in f32 under the bf16 hint changes the mean SNR by "
        + ", ".join(parts)
        + ", so no f32 island frees the headroom int8 layers would need at >= 30 dB"
    )


def machine_goals(suffix: str, label: str) -> list[dict]:
    """The speed, build and one-run goals on one other machine's files (nothing when it has none)."""
    rows = {s: [dict(r, side=s) for r in _sd15_rows(s, f"engines-cpu-sd15-{s}{suffix}")] for s in (256, 512)}
    timed = [r for rs in rows.values() for r in rs if "vs_eager" in r and r.get("load_1min", 0) <= MAX_LOAD]
    if not timed:
        return []
    best, fastest = _best_and_fastest(timed)
    out = [
        {
            "goal": f"best CPU engine >= 5x eager fp32 per U-Net step at >= 30 dB, on the {label}",
            "status": "met" if best and best["vs_eager"] >= 5 else "not met",
            "evidence": (f"best at >= 30 dB: {_fmt(best)} at {best['side']}^2" if best else "no row >= 30 dB")
            + f"; fastest of any SNR: {_fmt(fastest)} at {fastest['side']}^2; every timed row: "
            + ", ".join(f"{r['variant']} {r['vs_eager']}x at {r['snr_db']} dB ({r['side']}^2)" for r in timed)
            + _bf16_islands(
                (_load(f"engines-cpu-sd15-256{suffix}") or {}).get("meta", {}).get("cpu_family_model")
            ),
        }
    ]
    _, latest = _fresh_builds(rows[256])
    q = [r for v, r in latest.items() if v in QUANTISED_VARIANTS]
    if q:
        under = [r["variant"] for r in q if r["build_s"] < 120]
        over = [r["variant"] for r in q if r["build_s"] >= 120]
        out.append(
            {
                "goal": f"build < 120 s, full SD1.5 U-Net at 256^2, on the {label}",
                "status": "; ".join(
                    f"{word}: {', '.join(vs)}" for word, vs in (("met", under), ("not met", over)) if vs
                ),
                "evidence": "; ".join(_build_fmt(r) for r in latest.values()),
            }
        )
    # The judged tiny run: the newest rerun with the defaults now; an older file's variants that no
    # rerun repeated (e.g. ONNX Runtime int8) keep their figures.
    reruns = {
        "": "attention's Q and K int8 at the bf16 hint",
        "-attention": "QuantConfig(attention='auto'), the timestep still in the OpenVINO graph (before 71be135)",
        "-features": "the OpenVINO graph from the timestep's float32 features (71be135)",
    }
    # (name, why, data) of each file present, oldest first: each reads its file once
    chain = []
    for v, why in reruns.items():
        name = f"engines-tiny-e2e{suffix}-576{v}"
        if data := _load(name):
            chain.append((name, why, data))
    tiny_name, _, tiny = chain[-1] if chain else (None, None, None)
    if tiny:
        base = next(r for r in tiny["rows"] if r["variant"] == "eager")
        ci95 = {r["variant"]: f" [{r['ci95']}]" for r in tiny["rows"] if "ci95" in r}
        merged: dict[str, float] = {}
        for _, _, data in chain:
            merged.update(_points(data))
        before = "".join(
            f"; before ({name}: {why}): " + ", ".join(f"{v} {d:+.1f}" for v, d in _points(data).items())
            for name, why, data in reversed(chain[:-1])
        )
        out.append(
            {
                "goal": f"fastdiff-tiny end to end within 2 points of fp32 attribute accuracy, on the {label}",
                "status": f"{base['n']} images: {_within_two(merged)}",
                "evidence": f"({tiny_name}; the paired 95 % interval in brackets) eager fp32 'all' "
                f"{base['all']:.3f}; points vs eager: "
                + ", ".join(f"{v} {d:+.1f}{ci95.get(v, '')}" for v, d in _points(tiny).items())
                + before,
            }
        )
    profile = (_load(f"engines-cpu-build-profile-ov-int8-512-32{suffix}") or {}).get("meta")
    if profile:
        out.append(
            {
                "goal": f"peak memory < 8 GB for OpenVINO int8 at 512^2 with 32 records, on the {label}",
                "status": "met" if profile["peak_rss_gb"] < 8 else "not met",
                "evidence": f"whole default compile_engine int8 build with the PyTorch U-Net in the process "
                f"(statistics_batch={profile.get('statistics_batch')}): {profile['peak_rss_gb']} GB, "
                f"{profile['records']['calibrate']} records given, build {profile['total_without_quality_check_s']} s, "
                f"SNR {profile['quality']['snr_db']:.2f} dB (engines-cpu-build-profile-ov-int8-512-32{suffix})",
            }
        )
    for side, have in rows_present(rows).items():
        if have["runs"]:
            out.append(
                {
                    "goal": f"rows at {side}^2 in one run, on the {label}",
                    "status": "all present, in one run"
                    if have["complete_runs"]
                    else "missing: " + ", ".join(have["missing"]),
                    "evidence": "present: " + ", ".join(have["present"]) + f"; {_one_run(have)}",
                }
            )
    return out


# Why rows the judged files lack were not run, by side (filled in by whoever runs the benchmark).
NOT_RUN = {
    256: "not run on the AVX-512 machine",
    512: "not run on the AVX-512 machine: its benchmark lock time (2 cores shared with other jobs, one session "
    "ending 16:05 UTC) went to the 256^2 rows, the fastdiff-tiny end-to-end run and the 512^2 bf16 rows; an int8 build at 512^2 "
    "(export, ONNX Runtime sensitivity or NNCF passes) does not fit one 15-minute slot. A later ov-plain-fp32 run "
    "(2026-12-04 18:16 UTC) was cut before any row: recording the 512^2 calibration records took 195 s per batch "
    "(of 4) with other jobs on the CPU (load 3.6-4), so the records alone would have filled the slot. "
    "2026-12-05: the session lost two of its three hours to an outage before the benchmark started; the hour "
    "left went to the ov-int8 row (a whole default build, for the memory goal), plain OpenVINO f32 and "
    "torch.compile. A later session ran ort-fp32 (run 5) and ort-int8: with ONNX Runtime's own calibrator the "
    "process passed 22.7 GB on the first record and a watchdog killed it (24 GB machine); with fastdiff's grouped "
    "calibration (854198b) it completed (run 6), and then ov-mixed, whose layer sensitivity calibrates the same way",
}


def main():
    rows = goals(NOT_RUN)
    for suffix, label in OTHER_MACHINES.items():
        rows += machine_goals(suffix, label)
    meta = env_info()
    judged = _sd15_name(256)
    flags = _flags(judged) or engine_flags()
    meta["cpu_engine_flags"] = flags
    avx2_only = not has_vnni(frozenset(flags)) and not has_bf16(frozenset(flags))
    notes = (
        f"- CPU flags that matter, of the machine that measured {judged}: {', '.join(flags)}."
        + (
            " **AVX2-only: no VNNI (int8 dot products saturate, so ONNX Runtime uses 7-bit "
            "weights and int8 gains little) and no AVX512-BF16/AMX (bf16 is emulated, slower than fp32).** "
            "The issue's figures (OpenVINO bf16 3.66x, NNCF int8 4.7x) came from an AVX-512/VNNI/BF16 EPYC; "
            "they cannot be reproduced there."
            if avx2_only
            else " VNNI and native bf16: the kind of machine the issue's figures came from. The AVX2-only "
            "machine's results (engines-cpu-sd15-256/512, engines-tiny-e2e) stay as evidence of that machine "
            "and are quoted as 'earlier machine'."
        )
        + "\n- Cached rebuild and memory goals: engines-cpu-memory.json was measured on the AVX2-only machine "
        "(memory and cache reads do not depend on VNNI/bf16); on the AVX-512 machine a whole default int8 "
        "build at 512^2 (engines-cpu-sd15-512-avx512 run 3), an ONNX Runtime int8 cache hit at 256^2 "
        "(engines-cpu-sd15-256-avx512 run 15) and cache hits of five engines at 512^2 (engines-cpu-sd15-512-avx512 "
        "run 9, from a cold page cache: OpenVINO's first step then reads its blob cache, which holds the compiled "
        "weights again, 76.6 s for fp32 against a fresh compile's 8.3 s) were measured. Since c368679 that blob "
        "cache is off by default (engines-blob-cache: no sooner first output for fp32 and bf16, warm or cold)."
        + "\n- Cached rebuild (cache format 2): the 512^2 fp32 entry was filled by `engines_memory.py adopt` from "
        "the format-1 entry built at 15:26 UTC by the same export code (identical artifacts copied; key, "
        "meta.json and checksums written by compile_engine itself) instead of a 10-minute export on the shared "
        "machine. The measured rebuild itself is unmodified compile_engine in a fresh process."
        + "\n- Memory goal: judged on a whole default int8 build at 512^2 (compile_engine in the benchmark process) and, "
        "apart, on the stage alone (fp32 IR read memory-mapped, NNCF on 32 records streamed "
        "from disk, int8 IR written), like the earlier row, and like it with SmoothQuant off. A whole "
        "compile_engine int8 build also holds the PyTorch U-Net (3.4 GB) and runs the export in the same "
        "process: neither was measured at 512^2; compile_engine's int8 default runs SmoothQuant (one more statistics "
        "pass, on a model without the weight reductions) and, since this round, no bias correction. The "
        "stage run also predates the folding of NNCF's weight statistics (same ranges, less compile time). "
        f"Since {PYTORCH_ROUTE} int8 converts the PyTorch U-Net directly by default (NNCF then works on weights "
        "shared with the U-Net, not on a memory-mapped IR whose pages are given back): the 512^2 memory figure "
        "is for the IR route, which ExportConfig(openvino_source='onnx') keeps; the direct route's whole "
        "default build at 512^2 (engines-cpu-sd15-512-avx512 run 3: SmoothQuant on, 25 records) peaks at 11.2 GB "
        "(kernel high-water mark 11.76 GB), 7.2 GB above the 4.0 GB the process held before NNCF: **not met** for "
        "the default build (at 256^2 with SmoothQuant off both routes peak at 7.8-8.0 GB in the NNCF call, "
        "engines-cpu-int8-build-256-avx512; with SmoothQuant on 9.9 GB: engines-cpu-sd15-256-avx512 runs 9-10). "
        "The quantised result is unchanged by the fix: "
        "static vs dynamic calibration of the full U-Net at 256^2 (4 records) gives the same FakeQuantize ranges "
        "to 3e-6 of their width (compare row in engines-cpu-memory.md). No SNR exists for the earlier 512^2 "
        "run (cut before NNCF finished). The SNR is int8 vs fp32 OpenVINO on random weights: not representative "
        "of trained weights."
        + "\n- Build goal: each quantised variant's newest fresh (not cached) build at 256^2 (the goal names "
        "calibration and quantisation); the quality check (the engine's first compile, then engine and eager "
        "PyTorch on the held-back records) is reported apart where the run recorded it. Stage-by-stage timeline "
        "on the AVX2 machine (one int8 build, PyTorch-route conversion, contended CPU): "
        "engines-cpu-build-profile-pytorch-route.md: NNCF is most of the build (two statistics passes, the second "
        "one's compile of the statistics model the largest single item; fast bias correction's 160 sub-model "
        "compiles next). On the AVX-512 machine (engines-cpu-int8-build-256-avx512, NNCF settings side by side, "
        "contended CPU): that compile was ~80 s, nearly all of it OpenVINO's constant folding of the weights' "
        "reductions NNCF adds to the statistics model; fastdiff now computes them with numpy (6-20 s compile, "
        "identical ranges), bias correction is off by default (dropping it: under 0.1 dB here, +0.1 dB on fastdiff-tiny; ~26 s), and int8 "
        f"converts the U-Net directly instead of exporting ONNX ({PYTORCH_ROUTE}). SmoothQuant stays on: off, "
        "the build is 102.9 s (run 8, load 4.7) instead of 164.1 s (run 9, load ~3), +0.3 dB on the random-weight "
        "SD1.5 U-Net but -0.8 dB on fastdiff-tiny's trained U-Net (engines-tiny-int8-build-avx512), so "
        "QuantConfig(smooth_quant=False) is a documented option, not the default. Runs 7-9 shared the 2 cores "
        "with other jobs (their quality checks took 36-51 s against 12.6 s in run 2). The goal names fastdiff's int8 build; "
        "the status lists each quantised variant (ov-mixed adds layer sensitivity: ONNX Runtime's per-group sweep "
        "on the ONNX export up to run 18, OpenVINO's from the one NNCF run since run 19; ort-int8 is ONNX Runtime's "
        "calibration). Since run 19 NNCF's statistics models run at the engine's hint (bf16 here)."
        + "\n- Sources: "
        + ", ".join(
            f"{n}.md"
            for n in (
                judged,
                _sd15_name(512),
                *(f"engines-cpu-sd15-{side}{suffix}" for suffix in OTHER_MACHINES for side in (256, 512)),
                *(
                    f"engines-tiny-e2e{suffix}-576{v}"
                    for suffix in OTHER_MACHINES
                    for v in ("", "-attention", "-features")
                ),
                "engines-cpu-memory",
                _current("engines-tiny-e2e"),
                *(_current("engines-tiny-e2e") + suffix for suffix in TINY_RERUNS),
                "engines-cpu-int8-hint-sd15-full-256",
                "engines-time-features",
                "engines-cpu-int8-hint-sd15-full-512",
            )
            if _load(n)
        )
        + ". Random-weight SD1.5 U-Nets: speed is representative, SNR below fp32 is not (trained activations "
        "differ). The ov-bf16 row of engines-tiny-e2e-avx512 (2.95 dB per step, 'all' 0.049) was a fastdiff bug, "
        "not bf16: it was compiled after ov-fp32 (the same IR) through one shared OpenVINO blob cache; fixed in "
        "2adca0b (one blob folder per hint) and rerun in engines-tiny-e2e-avx512-bf16 (45.6 dB, +0.7 points). "
        "That run's ov-mixed row was compiled after ov-int8 in the same cache and was not rerun. "
        "Since 2026-12-05 int8 engines run their unquantised layers at the bf16 hint where native (run 11 at "
        "256^2); one int8 IR compiled both ways (engines-cpu-int8-hint-sd15-full-*): "
        + "; ".join(_hint_pair(side) for side in (256, 512) if _hint_pair(side))
        + "."
    )
    write_results("engines-cpu-goals", rows, meta, ["goal", "status", "evidence"], notes=notes)
    for r in rows:
        print(f"{r['status']:>12}  {r['goal']}")


if __name__ == "__main__":
    main()
