"""Lines of ``fastdiff/`` per module, then (a base revision) and now, split by feature (issue #10).

Issue #10's goal "fewer lines in ``fastdiff/`` for the same features" cannot be read off a plain
``wc -l``: features were added after the issue was filed (step caching, sweeps, OpenVINO, ...).
This script reads every module with ``git show REV:path`` (no checkout), counts

* ``code``: lines holding a token that is not a comment (a multi-line string that is not a
  docstring counts on every line it spans),
* ``doc``: lines of module / class / function docstrings,
* ``comment``: lines holding only a comment,
* ``blank``,

and attributes each module at HEAD to a feature that existed at the base revision or to one added
since, from the explicit table :data:`ADDED_SINCE` (each entry names the commit that added the
module; ``git log --diff-filter=A --format='%h %s' -- PATH``). A module present at the base revision
counts as an existing feature even where new features grew inside it (e.g. ``FastForward`` in
``dynamic/controllers.py``, input checks everywhere): the like-for-like figure therefore leans
against the goal, never for it. ``kernels/`` (``fastdiff/kernels/`` since it moved there;
its rows keep the old path and stay outside the fastdiff-only scope) is counted alongside because code moved
between it and ``fastdiff/ops`` (commit 2dbccb2).

    python benchmarks/line_count.py --base 0bc6ae6 --head HEAD
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env_info, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TREES = ("fastdiff", "kernels")
# Moved since the base revision: head prefix -> the prefix it had there. Rows are keyed by the old path, so
# a moved module is compared with itself and kernels stay out of the fastdiff-only scope (#10).
MOVED = {"fastdiff/kernels/": "kernels/"}


def base_path(path: str) -> str:
    """The path ``path`` (at head) had at the base revision."""
    for new, old in MOVED.items():
        if path.startswith(new):
            return old + path[len(new) :]
    return path


LONG_FILE = 350  # issue #10: no file above about this many lines without a reason in its docstring

# Modules added after 0bc6ae6, each: path -> (feature, existed at 0bc6ae6?, commit that added it, why).
# "Existed" means the module holds code of a feature that was already there (often moved out of a
# module that existed, as the commit says); "new" means a feature that 0bc6ae6 did not have.
ADDED_SINCE: dict[str, tuple[str, bool, str, str]] = {
    # --- features that existed, code moved or restructured (#10) ---
    "fastdiff/_lazy.py": (
        "fastdiff/ top level",
        True,
        "7fe613a",
        "lazy top level replacing eager imports (#10)",
    ),
    "fastdiff/_checks.py": (
        "fastdiff/ top level",
        True,
        "9386395",
        "one int/number rule for every package's argument checks (#10)",
    ),
    "fastdiff/installed.py": (
        "fastdiff/ top level",
        True,
        "5ad2aff",
        "one restore record replacing attribute sniffing (#10)",
    ),
    "fastdiff/unet_inputs.py": (
        "engines",
        True,
        "6379d52",
        "U-Net signature, four conversions made one (#10)",
    ),
    "fastdiff/ops/dispatch.py": (
        "kernels",
        True,
        "2dbccb2",
        "dispatch moved in from kernels/dispatch.py (#10)",
    ),
    "kernels/_device.py": ("kernels", True, "2dbccb2", "device checks once in fastdiff's dispatch (#10)"),
    "fastdiff/metrics/texture.py": (
        "metrics",
        True,
        "e268e56",
        "neighbour_difference moved in from a benchmark (#10)",
    ),
    "fastdiff/dynamic/adapters.py": ("dynamic", True, "cd27006", "split out of dynamic/loop.py (#10)"),
    "fastdiff/dynamic/protocols.py": ("dynamic", True, "cd27006", "split out of dynamic/loop.py (#10)"),
    "fastdiff/dynamic/records.py": ("dynamic", True, "cd27006", "split out of dynamic/loop.py (#10)"),
    "fastdiff/dynamic/tick.py": ("dynamic", True, "cd27006", "split out of dynamic/loop.py (#10)"),
    "fastdiff/dynamic/checks.py": ("dynamic", True, "3e519c6", "sample's checks moved out of loop.py (#10)"),
    "fastdiff/pipelines/plan.py": ("pipelines", True, "282e3e8", "split out of pipelines/_mixin.py (#10)"),
    "fastdiff/pipelines/capture.py": ("pipelines", True, "282e3e8", "split out of pipelines/_mixin.py (#10)"),
    "fastdiff/pipelines/records.py": ("pipelines", True, "282e3e8", "split out of pipelines/_mixin.py (#10)"),
    "fastdiff/pipelines/unet_calls.py": (
        "pipelines",
        True,
        "282e3e8",
        "split out of pipelines/_mixin.py (#10)",
    ),
    "fastdiff/engines/build.py": ("engines", True, "80bb1bd", "split out of engines/compile.py (#10)"),
    "fastdiff/engines/config.py": (
        "engines",
        True,
        "1615d4e",
        "config dataclasses replacing 25 keywords (#10)",
    ),
    "fastdiff/engines/runtime_common.py": ("engines", True, "80bb1bd", "shared by the ORT/TRT runners (#10)"),
    # --- features added since 0bc6ae6 ---
    "fastdiff/caching/__init__.py": ("step caching", False, "94a2ed6", "step caching (#13)"),
    "fastdiff/caching/cache.py": ("step caching", False, "94a2ed6", "step caching (#13)"),
    "fastdiff/caching/policy.py": ("step caching", False, "94a2ed6", "step caching (#13)"),
    "fastdiff/caching/profile.py": ("step caching", False, "94a2ed6", "step caching (#13)"),
    "fastdiff/caching/units.py": ("step caching", False, "94a2ed6", "step caching (#13)"),
    "fastdiff/caching/hooks.py": ("step caching", False, "24629a1", "split of caching/cache.py (#13)"),
    "fastdiff/caching/rows.py": ("step caching", False, "24629a1", "split of caching/cache.py (#13)"),
    "fastdiff/caching/stats.py": ("step caching", False, "24629a1", "split of caching/cache.py (#13)"),
    "fastdiff/caching/steps.py": ("step caching", False, "24629a1", "split of caching/cache.py (#13)"),
    "fastdiff/caching/pipeline.py": (
        "step caching",
        False,
        "122887a",
        "step_cache(pipe) on drop-in pipelines (#13)",
    ),
    "fastdiff/sweep/__init__.py": ("sweeps", False, "f5520ad", "spec-driven sweeps (#15)"),
    "fastdiff/sweep/collate.py": ("sweeps", False, "f5520ad", "spec-driven sweeps (#15)"),
    "fastdiff/sweep/embeddings.py": ("sweeps", False, "f5520ad", "spec-driven sweeps (#15)"),
    "fastdiff/sweep/runner.py": ("sweeps", False, "f5520ad", "spec-driven sweeps (#15)"),
    "fastdiff/sweep/setup.py": ("sweeps", False, "f5520ad", "spec-driven sweeps (#15)"),
    "fastdiff/sweep/spec.py": ("sweeps", False, "f5520ad", "spec-driven sweeps (#15)"),
    "fastdiff/sweep/store.py": ("sweeps", False, "f5520ad", "spec-driven sweeps (#15)"),
    "fastdiff/sweep/prompts.py": (
        "sweeps",
        False,
        "62230f1",
        "prompt sources split out of sweep/spec.py (#15)",
    ),
    "fastdiff/engines/runtime_ov.py": ("OpenVINO backend", False, "768da46", "OpenVINO backend (#14)"),
    "fastdiff/engines/openvino_build.py": ("OpenVINO backend", False, "1615d4e", "OpenVINO build (#14)"),
    "fastdiff/engines/nncf_rows.py": (
        "OpenVINO backend",
        False,
        "847ffbb",
        "NNCF statistics one guidance row at a time (#14)",
    ),
    "fastdiff/engines/ov_sensitivity.py": (
        "OpenVINO backend",
        False,
        "e7c88c7",
        "mixed's layer sensitivity on OpenVINO, replacing the ONNX Runtime sweep (#14)",
    ),
    "fastdiff/engines/nncf_folding.py": (
        "OpenVINO backend",
        False,
        "e7e8b5d",
        "NNCF statistics folding, out of runtime_ov (#14)",
    ),
    "fastdiff/engines/time_features.py": (
        "OpenVINO backend",
        False,
        "71be135",
        "OpenVINO graphs from the timestep's float32 features (#14)",
    ),
    "fastdiff/engines/cpu.py": (
        "CPU int8 without VNNI",
        False,
        "1c02f1c",
        "7-bit int8 weights without VNNI (#14)",
    ),
    "fastdiff/engines/records.py": (
        "calibration on disk",
        False,
        "0ecd63a",
        "records streamed from disk (#14)",
    ),
    "fastdiff/_cache_dir.py": (
        "fastdiff/ top level",
        True,
        "930cf0b",
        "one cache-folder rule replacing two copies (#10)",
    ),
    "fastdiff/caching/forecast.py": (
        "step caching",
        False,
        "7d8bf65",
        "feature forecasting on cached steps (#13)",
    ),
    "fastdiff/engines/ort_calibration.py": (
        "calibration on disk",
        False,
        "854198b",
        "ONNX Runtime calibration in bounded memory (#14)",
    ),
    "fastdiff/engines/mapped.py": (
        "calibration on disk",
        False,
        "f9dc300",
        "mapped weights given back while NNCF runs (#14)",
    ),
    "fastdiff/samplers/adaptive.py": ("step control", False, "e0e189f", "AdaptiveScheduler (#12)"),
    "fastdiff/dynamic/step_calibration.py": (
        "step control",
        False,
        "0b6a4a4",
        "steps-needed / Spearman judging of steps='auto' (#12)",
    ),
    "fastdiff/samplers/options.py": (
        "input validation",
        False,
        "ae36640",
        "make_scheduler option checks (#16)",
    ),
    "fastdiff/pipelines/checks.py": ("input validation", False, "7ae34d0", "diffusers keyword checks (#16)"),
    "fastdiff/testing/snapshot.py": (
        "input validation",
        False,
        "b100a71",
        "failed calls leave objects unchanged (#16)",
    ),
}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def modules(rev: str) -> list[str]:
    """Every ``.py`` file under :data:`TREES` at ``rev``."""
    out = _git("ls-tree", "-r", "--name-only", rev, "--", *TREES)
    return sorted(p for p in out.splitlines() if p.endswith(".py"))


def docstring_lines(tree: ast.AST) -> set[int]:
    """1-based line numbers spanned by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> set[int]:
    """1-based numbers of the lines that count as code (see the module docstring)."""
    return _classify(source)[0]


def count(source: str) -> dict[str, int]:
    """code / doc / comment / blank line counts of one module's source."""
    code, docs, comments = _classify(source)
    text = source.splitlines()
    blank = sum(1 for i, line in enumerate(text, 1) if not line.strip() and i not in docs and i not in code)
    return {
        "lines": len(text),
        "code": len(code),
        "doc": len(docs),
        "comment": len(comments - code - docs),
        "blank": blank,
    }


def _classify(source: str) -> tuple[set[int], set[int], set[int]]:
    docs = docstring_lines(ast.parse(source))
    code: set[int] = set()
    comments: set[int] = set()
    skip = {
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
        tokenize.ENCODING,
    }
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments.add(tok.start[0])
        elif tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return code - docs, docs, comments


def first_docstring_mentions_length(source: str) -> bool:
    """Whether the module docstring gives a reason for its length (it mentions 'lines' or 'long')."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    return "lines" in doc or "long" in doc


FEATURE_ISSUES = {"#12", "#13", "#14", "#15", "#16"}  # step control, caching, CPU engines, sweeps, validation


def blame_split(path: str, head: str, base_commits: set[str], subjects: dict[str, str]) -> dict[str, int]:
    """A module's code lines at ``head`` by the commit that last wrote each (``git blame -w -M -C``):

    ``base``: written at or before the base revision; ``feature``: by a later commit whose subject names
    only feature issues (:data:`FEATURE_ISSUES`), none of #10/#11; ``rework``: any other later commit.
    An estimate that leans *for* the goal: a pre-existing line edited by a feature commit counts as feature.
    """
    source = _git("show", f"{head}:{path}")
    wanted = code_lines(source)
    out = {"base": 0, "feature": 0, "rework": 0}
    porcelain = _git("blame", "-w", "-M", "-C", "--porcelain", head, "--", path)
    for line in porcelain.splitlines():
        part = line.split()
        if not line.startswith("\t") and re.fullmatch(r"[0-9a-f]{40}", part[0]) and int(part[2]) in wanted:
            sha = part[0]
            if sha in base_commits:
                out["base"] += 1
            else:
                tags = set(re.findall(r"#\d+", subjects.get(sha, "")))
                out["feature" if tags and tags <= FEATURE_ISSUES else "rework"] += 1
    return out


def feature_of(path: str, at_base: set[str]) -> tuple[str, bool, str, str]:
    if path in ADDED_SINCE:
        return ADDED_SINCE[path]
    if path in at_base:
        part = path.split("/")
        feature = part[1] if len(part) > 2 else ("kernels" if part[0] == "kernels" else "fastdiff/ top level")
        return feature, True, "", "present at the base revision"
    raise SystemExit(f"{path} is new since the base revision but has no ADDED_SINCE entry; add one")


def measure(base: str, head: str) -> tuple[list[dict], dict]:
    base_mods = modules(base)
    head_by_key = {base_path(p): p for p in modules(head)}
    at_base = set(base_mods)
    base_commits = set(_git("rev-list", base).split())
    subjects = dict(
        line.split(" ", 1) for line in _git("log", "--format=%H %s", f"{base}..{head}").splitlines()
    )
    rows = []
    for path in sorted(at_base | set(head_by_key)):
        then = count(_git("show", f"{base}:{path}")) if path in at_base else None
        head_path = head_by_key.get(path)
        now_src = _git("show", f"{head}:{head_path}") if head_path else None
        now = count(now_src) if now_src is not None else None
        feature, existed, commit, why = feature_of(path, at_base)
        why = why if now else "removed since the base revision"
        rows.append(
            {
                "module": path,
                "feature": feature,
                "existed": existed,
                "added_by": commit,
                "why": why,
                "code_then": then["code"] if then else 0,
                "code_now": now["code"] if now else 0,
                "doc_then": then["doc"] if then else 0,
                "doc_now": now["doc"] if now else 0,
                "lines_then": then["lines"] if then else 0,
                "lines_now": now["lines"] if now else 0,
                **(
                    {f"blame_{k}": v for k, v in blame_split(head_path, head, base_commits, subjects).items()}
                    if now and existed
                    else {"blame_base": 0, "blame_feature": 0, "blame_rework": 0}
                ),
                "long_without_reason": bool(
                    now and now["lines"] > LONG_FILE and not first_docstring_mentions_length(now_src)
                ),
            }
        )
    return rows, summarise(rows)


def _sum(rows, key, pred=lambda r: True) -> int:
    return sum(r[key] for r in rows if pred(r))


def summarise(rows: list[dict]) -> dict:
    out = {}
    for scope, in_scope in (("fastdiff", "fastdiff/"), ("fastdiff+kernels", "")):
        mine = [r for r in rows if r["module"].startswith(in_scope)]
        old = [r for r in mine if r["existed"]]
        out[scope] = {
            "all_code_then": _sum(mine, "code_then"),
            "all_code_now": _sum(mine, "code_now"),
            "all_lines_then": _sum(mine, "lines_then"),
            "all_lines_now": _sum(mine, "lines_now"),
            "existing_features_code_then": _sum(old, "code_then"),
            "existing_features_code_now": _sum(old, "code_now"),
            "existing_features_doc_then": _sum(old, "doc_then"),
            "existing_features_doc_now": _sum(old, "doc_now"),
            "existing_features_lines_then": _sum(old, "lines_then"),
            "existing_features_lines_now": _sum(old, "lines_now"),
            "new_features_code_now": _sum(mine, "code_now", lambda r: not r["existed"]),
            "existing_features_code_now_by_blame": {
                k: _sum(old, f"blame_{k}") for k in ("base", "rework", "feature")
            },
        }
    out["by_feature"] = {}  # "feature (existed|new)" -> [code lines then, now]
    for r in rows:
        key = f"{r['feature']} ({'existed' if r['existed'] else 'new'})"
        then_now = out["by_feature"].setdefault(key, [0, 0])
        then_now[0] += r["code_then"]
        then_now[1] += r["code_now"]
    out["long_without_reason"] = [r["module"] for r in rows if r["long_without_reason"]]
    return out


def verdict(summary: dict) -> str:
    s = summary["fastdiff"]
    then, now = s["existing_features_code_then"], s["existing_features_code_now"]
    k = summary["fastdiff+kernels"]
    b = s["existing_features_code_now_by_blame"]
    met = now < then and not summary["long_without_reason"]
    return (
        f"Goal (issue #10) 'fewer lines in fastdiff/ for the same features': **{'met' if met else 'not met'}**. "
        f"Code lines of the features that existed at the base revision: {then} then, {now} now "
        f"({now - then:+d}, {100 * (now - then) / then:+.1f} %); with their docstrings "
        f"{then + s['existing_features_doc_then']} then, {now + s['existing_features_doc_now']} now. "
        f"Counting kernels/ too (code moved between it and fastdiff/ops): "
        f"{k['existing_features_code_then']} then, {k['existing_features_code_now']} now. "
        f"Features added since hold {s['new_features_code_now']} code lines. "
        f"By git blame, the {now} existing-feature lines now were last written at or before the base "
        f"({b['base']}), by later #10/#11 rework or untagged commits ({b['rework']}), or by commits of "
        f"feature issues #12-#16 ({b['feature']}); without the last, {now - b['feature']} against {then} "
        f"(an estimate leaning for the goal: a line a feature commit edited counts as feature). "
        f"Files over {LONG_FILE} lines with no reason in their opening docstring: "
        f"{', '.join(summary['long_without_reason']) or 'none'}."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="0bc6ae6", help="revision issue #10 was filed at")
    ap.add_argument("--head", default="HEAD", help="revision to measure")
    ap.add_argument("--name", default="line_count", help="results file name")
    args = ap.parse_args()
    load_before = os.getloadavg()
    rows, summary = measure(args.base, args.head)
    meta = env_info()
    meta.update(
        base=f"{args.base} ({_git('log', '-1', '--format=%h %ad', '--date=short', args.base).strip()})",
        head=_git(
            "rev-parse", "--short", args.head
        ).strip(),  # committed files only: git show, not the work tree
        load_before=load_before,
        load_after=os.getloadavg(),
        summary=summary,
    )
    by_feature = "\n".join(f"- {k}: {a} -> {b}" for k, (a, b) in sorted(summary["by_feature"].items()))
    notes = (
        f"{verdict(summary)}\n\n"
        f"Base {meta['base']}, head {meta['head']}. `code` = non-blank lines holding a token that is not a "
        "comment, docstrings excluded (`doc`). A module present at the base counts as an existing feature "
        "even where new features grew inside it, so the like-for-like figure leans against the goal.\n\n"
        f"Code lines then -> now, by feature (kernels: fastdiff/ops/dispatch.py came from kernels/dispatch.py):\n"
        f"{by_feature}\n"
    )
    cols = [
        "module",
        "feature",
        "existed",
        "added_by",
        "code_then",
        "code_now",
        "doc_then",
        "doc_now",
        "lines_now",
    ]
    cols += ["blame_base", "blame_rework", "blame_feature"]
    write_results(args.name, rows, meta=meta, columns=cols, notes=notes)
    print(verdict(summary))


if __name__ == "__main__":
    main()
