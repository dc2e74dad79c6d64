"""Engines: ONNX export, calibration recording, Q/DQ quantisation, engine module, cache, quality gate, guards.

Everything runs on CPU with ONNX Runtime on fastdiff's tiny random-weight pipelines.
TensorRT cannot run here (no GPU, not installed): only its guard and profile shapes are tested.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import engines_fixtures  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fastdiff  # noqa: E402
from fastdiff._compat import is_available  # noqa: E402
from fastdiff.engines import (  # noqa: E402
    CalibrationData,
    EngineUNet,
    GateConfig,
    QualityGateError,
    QuantConfig,
    calibrate,
    compile_engine,
    export_onnx,
    quantize,
)
from fastdiff.engines import export as export_mod  # noqa: E402
from fastdiff.engines.quality import cosine_similarity, snr_db  # noqa: E402
from fastdiff.engines.quantization import (  # noqa: E402
    classify_nodes,
    qdq_summary,
    quantised_node_names,
    select_nodes,
)
from fastdiff.engines.runtime_ort import OrtRunner  # noqa: E402
from fastdiff.engines.runtime_trt import profile_shapes as tensorrt_profile_shapes  # noqa: E402
from fastdiff.testing import tiny_pipeline  # noqa: E402
from fastdiff.unet_inputs import unet_signature  # noqa: E402

# Shared with the other engine test module (pytest registers fixtures found in the module namespace).
pipe, calib = engines_fixtures.pipe, engines_fixtures.calib
PROMPTS, STEPS, _eager = engines_fixtures.PROMPTS, engines_fixtures.STEPS, engines_fixtures.eager


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def onnx_path(pipe, tmp_path_factory):
    return export_onnx(pipe.unet, tmp_path_factory.mktemp("export") / "unet.onnx")


@pytest.fixture(scope="module")
def int8_conv(onnx_path, calib, tmp_path_factory):
    return quantize(
        onnx_path, calib, level="conv", method="minmax", out_path=tmp_path_factory.mktemp("q") / "conv.onnx"
    )


@pytest.fixture(scope="module")
def fp32_cache(pipe, tmp_path_factory):
    """A cache directory holding the tiny U-Net's fp32 engine (built once for the module)."""
    root = tmp_path_factory.mktemp("cache")
    compile_engine(pipe.unet, precision="fp32", cache_dir=root)
    return root


@pytest.fixture
def cache_copy(fp32_cache, tmp_path):
    """A private copy of the prebuilt cache, for tests that damage it."""
    dst = tmp_path / "cache"
    shutil.copytree(fp32_cache, dst)
    return dst


@pytest.fixture
def count_exports(monkeypatch):
    calls = []
    real = export_mod.export_onnx

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(export_mod, "export_onnx", counting)
    return calls


# ---------------------------------------------------------------- export


def test_export_is_valid_and_matches_eager_on_other_shapes(pipe, onnx_path):
    onnx.checker.check_model(str(onnx_path))
    model = onnx.load(str(onnx_path))
    assert [i.name for i in model.graph.input] == ["sample", "timestep", "encoder_hidden_states"]
    runner = OrtRunner(onnx_path)
    sig = unet_signature(pipe.unet)
    torch.manual_seed(1)
    # Dynamic axes: batch 3 and a non-square 24x16 latent, unlike the 2x16x16 tracing input.
    inputs = sig.example_inputs(3, 24, 16)
    inputs["timestep"] = torch.tensor([999.0, 500.5, 1.0])
    out = runner(inputs)
    ref = _eager(pipe.unet, inputs)
    assert out.shape == ref.shape
    assert _rel(out, ref) < 1e-4


def test_export_sdxl_added_conditioning(tmp_path):
    sdxl = tiny_pipeline("sdxl", size="tiny", seed=0)
    sig = unet_signature(sdxl.unet)
    assert sig.is_sdxl and sig.time_ids_dim == 6
    path = export_onnx(sdxl.unet, tmp_path / "xl.onnx")
    names = [i.name for i in onnx.load(str(path)).graph.input]
    assert names == ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"]
    torch.manual_seed(2)
    inputs = sig.example_inputs(2, 16, 16)
    assert _rel(OrtRunner(path)(inputs), _eager(sdxl.unet, inputs)) < 1e-4


def test_export_external_data(pipe, tmp_path):
    path = export_onnx(pipe.unet, tmp_path / "ext.onnx", external_data=True)
    data = tmp_path / "ext.onnx.data"
    assert data.is_file() and data.stat().st_size > path.stat().st_size
    onnx.checker.check_model(str(path))
    inputs = unet_signature(pipe.unet).example_inputs(2, 16, 16)
    assert _rel(OrtRunner(path)(inputs), _eager(pipe.unet, inputs)) < 1e-4


@pytest.mark.parametrize("layout", ["inline", "one file per tensor", "one shared file"])
def test_consolidate_onnx_streams_any_layout_into_one_data_file(onnx_path, tmp_path, layout):
    """The exporter writes one file per tensor above 2 GB; consolidate_onnx copies the bytes into the
    one ``<name>.data`` layout without loading them. Every tensor must arrive intact, at its offset."""
    from fastdiff.engines.export import consolidate_onnx

    model = onnx.load(str(onnx_path))
    expected = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    src = tmp_path / "src" / "m.onnx"
    src.parent.mkdir()
    if layout == "inline":
        onnx.save_model(model, str(src))
    else:
        onnx.save_model(
            model,
            str(src),
            save_as_external_data=True,
            all_tensors_to_one_file=layout == "one shared file",
            location="shared.bin" if layout == "one shared file" else None,
            size_threshold=0,
        )
    (tmp_path / "out").mkdir()
    dst = consolidate_onnx(src, tmp_path / "out" / "engine.onnx")
    assert sorted(p.name for p in dst.parent.iterdir()) == ["engine.onnx", "engine.onnx.data"]
    bare = onnx.load(str(dst), load_external_data=False)
    for tensor in bare.graph.initializer:
        external = tensor.data_location == onnx.TensorProto.EXTERNAL
        # Inline tensors move out from 1 KB (as onnx.save_model does); external ones stay external.
        assert external == (layout != "inline" or expected[tensor.name].nbytes >= 1024), tensor.name
        if external:
            assert {e.key: e.value for e in tensor.external_data}["location"] == "engine.onnx.data"
    got = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(dst)).graph.initializer}
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name
    onnx.checker.check_model(str(dst))
    with pytest.raises(ValueError, match="must not be src"):
        consolidate_onnx(dst, dst)


def test_export_refuses_inline_weights_above_the_protobuf_limit(pipe, tmp_path, monkeypatch):
    monkeypatch.setattr(export_mod, "_PROTOBUF_LIMIT_BYTES", 1024)
    with pytest.raises(ValueError, match="external_data=True"):
        export_onnx(pipe.unet, tmp_path / "a.onnx", external_data=False)


def test_export_bad_arguments(pipe, tmp_path):
    with pytest.raises(ValueError, match="opset"):
        export_onnx(pipe.unet, tmp_path / "a.onnx", opset=11)
    with pytest.raises(ValueError, match="dynamic"):
        export_onnx(pipe.unet, tmp_path / "a.onnx", dynamic=("batch", "time"))
    with pytest.raises(ValueError, match="sample_shape"):
        export_onnx(pipe.unet, tmp_path / "a.onnx", sample_shape=(2, 3, 16, 16))
    with pytest.raises(TypeError, match="UNet2DConditionModel"):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "a.onnx")


# ---------------------------------------------------------------- calibration


def test_calibration_records_every_step_with_cfg_pairs(pipe, calib, tmp_path):
    assert len(calib) == len(PROMPTS) * STEPS
    pipe.scheduler.set_timesteps(STEPS)
    expected = [float(t) for t in pipe.scheduler.timesteps] * len(PROMPTS)
    assert calib.timesteps == expected
    for r in calib:
        assert r["sample"].shape[0] == 2  # unconditional + conditional
        assert r["timestep"].shape == (2,)
        assert r["encoder_hidden_states"].shape[:2] == (2, 77)
        # The CFG pair shares its latent but not its text embedding.
        torch.testing.assert_close(r["sample"][0], r["sample"][1])
        assert not torch.equal(r["encoder_hidden_states"][0], r["encoder_hidden_states"][1])
    saved = calib.save(tmp_path / "calib.safetensors")
    loaded = CalibrationData.load(saved)
    assert len(loaded) == len(calib) and loaded.meta["num_inference_steps"] == STEPS
    assert loaded.fingerprint() == calib.fingerprint()
    fit, held = calib.split(4)
    assert len(fit) + len(held) == len(calib) and len(held) == len(calib) // 4


def test_calibrate_bad_input(pipe):
    with pytest.raises(ValueError, match="at least one prompt"):
        calibrate(pipe, [], 2)
    with pytest.raises(ValueError, match="num_inference_steps"):
        calibrate(pipe, ["a cat"], 0)
    with pytest.raises(TypeError, match="pipeline"):
        calibrate(object(), ["a cat"], 2)


# ---------------------------------------------------------------- quantisation


def test_node_classification(onnx_path):
    cats = classify_nodes(onnx_path)
    by_cat = {}
    for name, cat in cats.items():
        by_cat.setdefault(cat, []).append(name)
    assert {"conv", "qkv", "ffn", "attention", "time_embedding", "conv_in", "conv_out"} <= set(by_cat)
    assert all("/attn" in n for n in by_cat["attention"])
    assert all("to_q" in n or "to_k" in n or "to_v" in n for n in by_cat["qkv"])
    chosen = select_nodes(onnx_path, "conv+ffn+qkv")
    assert not any(cats[n] in ("attention", "time_embedding", "conv_in", "conv_out") for n in chosen)
    assert len(select_nodes(onnx_path, "conv")) < len(chosen)


def test_quantize_inserts_qdq_and_keeps_exclusions_float(pipe, onnx_path, int8_conv, calib):
    summary = qdq_summary(int8_conv)
    assert summary["QuantizeLinear"] > 0 and summary["DequantizeLinear"] > 0
    cats = classify_nodes(int8_conv)
    quantised = quantised_node_names(int8_conv)
    assert quantised and all(cats[n] == "conv" for n in quantised)
    for name, cat in cats.items():
        if cat in ("conv_in", "conv_out", "time_embedding", "attention", "ffn", "qkv"):
            assert name not in quantised, name
    # It still computes the U-Net: close to, but not bit-equal with, the float graph.
    _, held = calib.split(4)
    ref = _eager(pipe.unet, held.records[0])
    out = OrtRunner(int8_conv)(held.records[0])
    assert 15 < snr_db(out, ref) < 120


def test_int8_kernels_match_the_qdq_graph_on_this_cpu(pipe, onnx_path, calib, tmp_path):
    """The fused int8 kernels must compute what the Q/DQ graph means (evaluated in float, no fusion).

    Regression: on CPUs without VNNI, u8 x s8 pairs saturate at int16 (vpmaddubsw); 8-bit weights
    took the tiny U-Net from 25 dB (graph meaning) to 12 dB. ``reduce_range`` defaults to 7-bit
    weights there. On a VNNI CPU this checks the same agreement with 8-bit weights.
    """
    import onnxruntime as ort

    from fastdiff.engines.cpu import has_vnni
    from fastdiff.engines.quantization import default_reduce_range

    assert default_reduce_range("uint8") == (not has_vnni()) and not default_reduce_range("int8")
    assert has_vnni(frozenset({"avx2", "avx512_vnni"})) and not has_vnni(frozenset({"avx2", "fma"}))
    fit, held = calib.split(4)
    q = quantize(onnx_path, fit, level="conv+ffn+qkv", method="minmax", out_path=tmp_path / "q.onnx")
    ref = OrtRunner(onnx_path)
    fused = OrtRunner(q)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(str(q), so, providers=["CPUExecutionProvider"])
    refs, outs_fused, outs_plain = [], [], []
    for r in held:
        refs.append(ref(r))
        outs_fused.append(fused(r))
        outs_plain.append(torch.from_numpy(plain.run(None, {k: v.numpy() for k, v in r.items()})[0]))
    snr_fused = snr_db(torch.cat(outs_fused), torch.cat(refs))
    snr_plain = snr_db(torch.cat(outs_plain), torch.cat(refs))
    assert snr_plain > 15
    assert snr_fused > snr_plain - 3, (snr_fused, snr_plain)


def test_quantize_exclude_regex_and_bad_arguments(onnx_path, calib, tmp_path):
    path = quantize(
        onnx_path,
        calib,
        level="conv",
        method="minmax",
        exclude=(r"down_blocks",),
        out_path=tmp_path / "q.onnx",
    )
    quantised = quantised_node_names(path)
    assert quantised and not any("down_blocks" in n for n in quantised)
    with pytest.raises(ValueError, match="level"):
        quantize(onnx_path, calib, level="everything")
    with pytest.raises(ValueError, match="method"):
        quantize(onnx_path, calib, method="mse")
    with pytest.raises(ValueError, match="CalibrationData"):
        quantize(onnx_path, CalibrationData([]))
    with pytest.raises(ValueError, match="selects no node"):
        quantize(onnx_path, calib, level="conv", exclude=(".",), out_path=tmp_path / "none.onnx")
    with pytest.raises(ValueError, match="out_path must differ"):
        quantize(onnx_path, calib, out_path=onnx_path)


def test_quantize_replaces_an_earlier_model_at_its_path(pipe, calib, tmp_path):
    """layer_sensitivity quantises one group after another to one path; onnx appends to an existing
    data file, so each model used to grow it by the whole model (the disk filled at 256^2)."""
    src = export_onnx(pipe.unet, tmp_path / "unet.onnx", external_data=True)
    out, data = tmp_path / "q.onnx", tmp_path / "q.onnx.data"
    sizes, outputs = [], []
    inputs = unet_signature(pipe.unet).example_inputs(2, 16, 16)
    for _ in range(2):
        quantize(src, calib, level="conv", method="minmax", out_path=out, max_calibration_records=2)
        sizes.append(data.stat().st_size)
        outputs.append(OrtRunner(out)(inputs))
    assert sizes[0] == sizes[1] and sizes[0] > 0
    assert torch.equal(outputs[0], outputs[1])


# ---------------------------------------------------------------- engine module in a pipeline


def test_engine_runs_inside_pipeline_and_restores(pipe, fp32_cache):
    original = pipe.unet
    gen = torch.Generator().manual_seed(0)
    ref = pipe(["a red cat"], num_inference_steps=2, output_type="latent", generator=gen).images
    engine = compile_engine(pipe, precision="fp32", cache_dir=fp32_cache)
    try:
        assert pipe.unet is engine and isinstance(engine, EngineUNet)
        assert engine.fastdiff_original_unet is original
        assert list(engine.parameters()) == []  # the original U-Net is not a submodule
        assert engine.config == original.config and engine.dtype == torch.float32
        assert engine.device == torch.device("cpu")
        assert engine.quality["snr_db"] > 80
        gen = torch.Generator().manual_seed(0)
        out = pipe(["a red cat"], num_inference_steps=2, output_type="latent", generator=gen).images
        assert _rel(out, ref) < 1e-4
    finally:
        fastdiff_restore(pipe)
    assert pipe.unet is original and not fastdiff.installed.installations(pipe)


def test_engine_timestep_forms_and_outputs(pipe, fp32_cache):
    engine = compile_engine(pipe.unet, precision="fp32", cache_dir=fp32_cache)
    sig = unet_signature(pipe.unet)
    torch.manual_seed(3)
    inputs = sig.example_inputs(2, 16, 16)
    ref = _eager(pipe.unet, {**inputs, "timestep": torch.full((2,), 321.0)})
    x, ehs = inputs["sample"], inputs["encoder_hidden_states"]
    for t in (321, 321.0, torch.tensor(321), torch.tensor([321.0]), torch.tensor([321, 321])):
        out = engine(x, t, ehs).sample
        assert _rel(out, ref) < 1e-4, t
    (tup,) = engine(x, 321, encoder_hidden_states=ehs, return_dict=False)
    assert torch.equal(tup, engine(x, 321, ehs).sample)
    assert engine(x.double(), 321, ehs.double()).sample.dtype == torch.float64


def test_engine_bad_inputs(pipe, fp32_cache):
    engine = compile_engine(pipe.unet, precision="fp32", cache_dir=fp32_cache)
    x, ehs = torch.randn(2, 4, 16, 16), torch.randn(2, 77, 32)
    with pytest.raises(ValueError, match="sample must be"):
        engine(torch.randn(2, 3, 16, 16), 10, ehs)
    with pytest.raises(ValueError, match="timestep"):
        engine(x, torch.tensor([1.0, 2.0, 3.0]), ehs)
    with pytest.raises(TypeError, match="timestep"):
        engine(x, "10", ehs)
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        engine(x, 10, torch.randn(3, 77, 32))
    with pytest.raises(NotImplementedError, match="ControlNet"):
        engine(x, 10, ehs, mid_block_additional_residual=torch.zeros(1))
    f = 2**pipe.unet.num_upsamplers  # the PyTorch U-Net runs any size; the traced graph only multiples of f
    odd = torch.randn(1, 4, 4 * f + 1, 4 * f)
    assert torch.isfinite(pipe.unet(odd, 10, ehs[:1]).sample).all()
    with pytest.raises(ValueError, match=rf"cannot run a {4 * f + 1}x{4 * f} latent.*not a multiple of {f}"):
        engine(odd, 10, ehs[:1])


@settings(max_examples=4, deadline=None)
@given(batch=st.integers(1, 3), h=st.sampled_from([8, 12, 16, 20]), w=st.sampled_from([8, 16, 24]))
def test_engine_matches_eager_on_random_shapes(pipe, fp32_cache, batch, h, w):
    engine = compile_engine(pipe.unet, precision="fp32", cache_dir=fp32_cache)
    torch.manual_seed(batch * 100 + h * 10 + w)
    inputs = unet_signature(pipe.unet).example_inputs(batch, h, w)
    assert (
        _rel(engine(inputs["sample"], 500, inputs["encoder_hidden_states"]).sample, _eager(pipe.unet, inputs))
        < 1e-4
    )


# ---------------------------------------------------------------- cache


def test_cache_hit_skips_export(pipe, cache_copy, count_exports):
    engine = compile_engine(pipe.unet, precision="fp32", cache_dir=cache_copy)
    assert len(count_exports) == 0 and engine.cache_hit
    assert engine.artifact.parent.parent == cache_copy
    # Different weights -> different key -> a new build.
    import copy

    other = copy.deepcopy(pipe.unet)
    with torch.no_grad():
        other.conv_in.bias.add_(1.0)
    third = compile_engine(other, precision="fp32", cache_dir=cache_copy)
    assert len(count_exports) == 1 and not third.cache_hit and third.artifact != engine.artifact


def test_corrupt_cache_entry_is_rebuilt(pipe, cache_copy, count_exports):
    (entry,) = [p for p in cache_copy.iterdir() if p.is_dir()]
    artifact = entry / "engine.onnx"
    blob = bytearray(artifact.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # one flipped byte
    artifact.write_bytes(bytes(blob))
    rebuilt = compile_engine(pipe.unet, precision="fp32", cache_dir=cache_copy)
    assert len(count_exports) == 1 and not rebuilt.cache_hit
    assert rebuilt.quality["snr_db"] > 80
    assert compile_engine(pipe.unet, precision="fp32", cache_dir=cache_copy).cache_hit


def test_stale_or_incomplete_cache_entry_is_rejected(pipe, cache_copy, count_exports):
    from fastdiff.engines.cache import EngineCache

    (entry,) = [p for p in cache_copy.iterdir() if p.is_dir()]
    meta_path = entry / "meta.json"
    meta = json.loads(meta_path.read_text())
    cache = EngineCache(cache_copy)
    assert cache.validate(entry.name, meta["parts"]) is None
    stale = json.loads(json.dumps(meta["parts"]))
    stale["versions"]["onnxruntime"] = "0.0.1"
    assert "stale" in cache.validate(entry.name, stale)
    (entry / "engine.onnx").unlink()
    assert "missing" in cache.validate(entry.name, meta["parts"])
    meta_path.unlink()
    assert "meta.json" in cache.validate(entry.name, meta["parts"])
    again = compile_engine(pipe.unet, precision="fp32", cache_dir=cache_copy)
    assert len(count_exports) == 1 and not again.cache_hit
    assert not any(p.name.startswith(".staging") for p in cache_copy.iterdir())


def test_weights_fingerprint_sees_every_element(pipe):
    """#14: the threaded per-tensor fingerprint changes when any single element of any tensor changes
    (by one ulp), when two same-shaped tensors swap contents, and on a dtype change; it does not
    depend on the thread count; a reference hashes the same tree serially from ``tobytes()``."""
    import copy
    import hashlib

    from fastdiff.engines.cache import weights_fingerprint

    unet = copy.deepcopy(pipe.unet)
    base = weights_fingerprint(unet)

    def reference(module):
        h = hashlib.sha256()
        for name, t in sorted(module.state_dict().items()):
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode() + hashlib.sha256(raw).digest())
        return h.hexdigest()

    assert base == reference(unet) == weights_fingerprint(unet, threads=1)
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    params = [p for p in unet.parameters() if p.numel() > 1]
    with torch.no_grad():
        for _ in range(3):  # one element of a random tensor, nudged by one ulp
            p = params[int(torch.randint(len(params), (), generator=gen))]
            i = int(torch.randint(p.numel(), (), generator=gen))
            flat = p.view(-1)
            old = flat[i].clone()
            flat[i] = torch.nextafter(old, old + 1)
            assert weights_fingerprint(unet) != base
            flat[i] = old
            assert weights_fingerprint(unet) == base
        a, b = next((x, y) for x in params for y in params if x is not y and x.shape == y.shape)
        saved = a.clone()
        a.copy_(b)
        b.copy_(saved)
        assert weights_fingerprint(unet) != base
        b.copy_(a)
        a.copy_(saved)
    assert weights_fingerprint(unet) == base
    assert weights_fingerprint(unet.to(torch.float64)) != base


def test_cached_artifact_checks(pipe, cache_copy):
    """#14: the default "stat" check finds a truncated artifact (size) and an edited one (its mtime
    moved, so it is re-hashed); an edit that puts the old mtime back passes it and only
    verify="full" finds it. A copy that lost its mtimes but is intact stays valid."""
    import os
    import time

    from fastdiff.engines.cache import EngineCache

    (entry,) = [p for p in cache_copy.iterdir() if p.is_dir()]
    parts = json.loads((entry / "meta.json").read_text())["parts"]
    cache = EngineCache(cache_copy)
    artifact = entry / "engine.onnx"
    good = artifact.read_bytes()
    st = artifact.stat()
    assert cache.validate(entry.name, parts) is None
    assert cache.validate(entry.name, parts, verify="full") is None
    with pytest.raises(ValueError, match="verify must be one of"):
        cache.validate(entry.name, parts, verify="quick")

    os.utime(artifact, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # intact, new mtime: re-hashed, kept
    assert cache.validate(entry.name, parts) is None
    assert (
        json.loads((entry / "meta.json").read_text())["files"]["engine.onnx"]["mtime_ns"]
        == st.st_mtime_ns + 10**9
    )
    st = artifact.stat()

    artifact.write_bytes(good[:-100])
    assert "wrong size" in cache.validate(entry.name, parts)
    time.sleep(0.05)  # past the filesystem's timestamp tick, as any later edit is
    blob = bytearray(good)
    blob[len(blob) // 3] ^= 0x01  # one flipped bit, same size
    artifact.write_bytes(bytes(blob))
    assert "sha256" in cache.validate(entry.name, parts)
    os.utime(artifact, ns=(st.st_atime_ns, st.st_mtime_ns))  # the edit hides its mtime
    assert cache.validate(entry.name, parts) is None  # the documented limit of "stat"
    assert "sha256" in cache.validate(entry.name, parts, verify="full")
    assert not compile_engine(pipe.unet, precision="fp32", cache_dir=cache_copy, verify="full").cache_hit
    with pytest.raises(ValueError, match="verify must be one of"):
        compile_engine(pipe.unet, precision="fp32", cache_dir=cache_copy, verify="sha")


def test_cache_root_env(monkeypatch, tmp_path):
    from fastdiff.engines.cache import cache_root

    monkeypatch.setenv("FASTDIFF_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path / "engines"
    monkeypatch.delenv("FASTDIFF_CACHE_DIR")
    assert str(cache_root()).endswith(".cache/fastdiff/engines")


# ---------------------------------------------------------------- int8 engine and quality gate


def test_int8_engine_quality_gate(pipe, calib, tmp_path):
    with pytest.raises(QualityGateError) as err:
        compile_engine(
            pipe,
            precision="int8",
            calibration=calib,
            cache_dir=tmp_path,
            quant=QuantConfig(method="minmax"),
            gate=GateConfig(min_snr_db=200),
        )
    assert "SNR" in str(err.value) and "force=True" in str(err.value)
    measured = err.value.quality["snr_db"]
    assert 15 < measured < 200
    assert not isinstance(pipe.unet, EngineUNet)  # refused: nothing installed
    engine = compile_engine(
        pipe,
        precision="int8",
        calibration=calib,
        cache_dir=tmp_path,
        quant=QuantConfig(method="minmax"),
        gate=GateConfig(min_snr_db=200, force=True),
    )
    try:
        assert pipe.unet is engine and engine.cache_hit  # built once, reused by the forced call
        assert math.isclose(engine.quality["snr_db"], measured)
        assert engine.quality["num_inputs"] == len(calib.split(4)[1])
        out = pipe(["a red cat"], num_inference_steps=2, output_type="latent").images
        assert torch.isfinite(out).all()
    finally:
        fastdiff_restore(pipe)


@pytest.mark.parametrize("explicit_quality_inputs", [False, True])
def test_int8_calibrates_on_every_record_when_quality_inputs_are_given(
    pipe, calib, tmp_path, monkeypatch, explicit_quality_inputs
):
    """Regression: with explicit quality_inputs, every 4th calibration record was still held back,
    and then neither calibrated on nor judged (25 of 33 records calibrated at 512^2, issue #14)."""
    from fastdiff.engines import compile as compile_mod

    class Stop(Exception):
        pass

    seen = {}

    def spy(unet, entry, backend, precision, calib_part, *rest):
        seen["records"] = calib_part.records
        raise Stop

    monkeypatch.setattr(compile_mod, "build", spy)
    held_out = calib.subset(2)
    with pytest.raises(Stop):
        compile_engine(
            pipe.unet,
            precision="int8",
            calibration=calib,
            quality_inputs=held_out if explicit_quality_inputs else None,
            cache_dir=tmp_path,
            install=False,
        )
    expected = calib.records if explicit_quality_inputs else calib.split(4)[0].records
    assert len(seen["records"]) == (len(calib) if explicit_quality_inputs else len(calib) - len(calib) // 4)
    assert all(a is b for a, b in zip(seen["records"], expected, strict=True))


def fastdiff_restore(pipe):
    from fastdiff import installed

    assert installed.undo_all(pipe, "engine") >= 1


def test_onnx_runtime_export_traces_at_the_smallest_latent(pipe, monkeypatch, tmp_path):
    """Every spatial axis is dynamic, so the trace runs at the smallest latent each level divides, as
    for OpenVINO; the engine still matches eager at other shapes (test_engine_matches_eager_on_random_shapes)."""
    shapes = []
    real = export_mod.export_onnx
    monkeypatch.setattr(
        export_mod, "export_onnx", lambda *a, **k: shapes.append(k.get("sample_shape")) or real(*a, **k)
    )
    compile_engine(pipe.unet, precision="fp32", cache_dir=tmp_path, install=False)
    sig = unet_signature(pipe.unet)
    side = 2 ** (sig.num_levels - 1)
    assert side < sig.sample_size and shapes == [(2, sig.in_channels, side, side)]


def test_no_cache_build_leaves_no_temporary_folder(pipe, monkeypatch):
    """Regression: use_cache=False built in a mkdtemp folder holding the whole model and never removed it."""
    import tempfile

    made = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    engine = compile_engine(pipe.unet, precision="fp32", use_cache=False)
    roots = [m for m in made if "fastdiff-engine-" in m]
    assert roots and not any(__import__("os").path.exists(m) for m in roots)
    assert engine.artifact is None
    r = {"sample": torch.randn(2, 4, 16, 16), "encoder_hidden_states": torch.randn(2, 77, 32)}
    out = engine(r["sample"], 500, r["encoder_hidden_states"]).sample  # runs from memory
    assert _rel(out, _eager(pipe.unet, {**r, "timestep": torch.full((2,), 500.0)})) < 1e-4


def test_compile_engine_bad_arguments(pipe, calib):
    with pytest.raises(ValueError, match="backend"):
        compile_engine(pipe, backend="tvm")
    with pytest.raises(ValueError, match="precision"):
        compile_engine(pipe, precision="fp16")  # ONNX Runtime CPU path: fp32 or int8
    with pytest.raises(ValueError, match="calibration"):
        compile_engine(pipe, precision="int8")
    with pytest.raises(TypeError, match="CalibrationData"):
        compile_engine(pipe, precision="int8", calibration=[1, 2])
    with pytest.raises(TypeError, match="pipeline"):
        compile_engine(object())


def test_records_of_another_unet_are_rejected_before_any_build(pipe, calib, count_exports, tmp_path):
    """SDXL records (or another text width) fed to this SD1.5 engine: a ValueError naming the argument,
    not ONNX Runtime's INVALID_ARGUMENT from inside the quality check after the export."""
    sig = unet_signature(pipe.unet)
    sdxl = dataclasses.replace(sig, text_embeds_dim=16, time_ids_dim=6)
    sdxl_records = CalibrationData([sdxl.example_inputs(2, 8, 8, sequence=5) for _ in range(3)])
    with pytest.raises(ValueError, match=r"calibration records were not recorded from this U-Net.*extra"):
        compile_engine(pipe, precision="int8", calibration=sdxl_records, cache_dir=tmp_path, install=False)
    wide = dataclasses.replace(sig, cross_attention_dim=sig.cross_attention_dim * 2)
    wide_records = CalibrationData([wide.example_inputs(2, 8, 8, sequence=5) for _ in range(2)])
    with pytest.raises(ValueError, match=r"quality_inputs records.*cross_attention_dim"):
        compile_engine(pipe, quality_inputs=wide_records, cache_dir=tmp_path, install=False)
    with pytest.raises(TypeError, match="quality_inputs must be CalibrationData"):
        compile_engine(pipe, quality_inputs=[calib.records[0]], cache_dir=tmp_path, install=False)
    assert count_exports == []


def test_public_export():
    assert fastdiff.compile_engine is compile_engine


# ---------------------------------------------------------------- metrics


def test_snr_and_cosine():
    torch.manual_seed(0)
    ref = torch.randn(10_000, dtype=torch.float64)
    noise = torch.randn(10_000, dtype=torch.float64)
    noise *= ref.norm() / noise.norm() / 10.0  # noise power 1/100 of the signal
    assert math.isclose(snr_db(ref + noise, ref), 20.0, abs_tol=1e-9)
    assert snr_db(ref, ref) == math.inf
    assert math.isclose(cosine_similarity(ref, 3 * ref), 1.0)
    assert math.isclose(cosine_similarity(ref, -ref), -1.0)


# ---------------------------------------------------------------- TensorRT (not runnable here)


@pytest.mark.skipif(is_available("tensorrt"), reason="tensorrt is installed; the guard does not apply")
def test_tensorrt_guard(pipe):
    with pytest.raises(ImportError, match=r"pip install 'fastdiff\[tensorrt\]'"):
        compile_engine(pipe, backend="tensorrt", precision="fp16")
    from fastdiff.engines.runtime_trt import build_engine as build_tensorrt_engine

    with pytest.raises(ImportError, match="tensorrt"):
        build_tensorrt_engine("unet.onnx", "unet.plan", {})


def test_tensorrt_profile_shapes(pipe, onnx_path):
    sig = unet_signature(pipe.unet)
    shapes = tensorrt_profile_shapes(sig, batch=(1, 1, 8), image_px=(256, 512, 1024))
    # Every engine input gets a (min, opt, max) triple; batch doubles for CFG, latents are px / 8.
    assert set(shapes) == {i.name for i in onnx.load(str(onnx_path)).graph.input}
    assert shapes["sample"] == ((2, 4, 32, 32), (2, 4, 64, 64), (16, 4, 128, 128))
    assert shapes["timestep"] == ((2,), (2,), (16,))
    assert shapes["encoder_hidden_states"][2] == (16, 77, 32)
    xl = tensorrt_profile_shapes(unet_signature(tiny_pipeline("sdxl").unet), batch=(1, 2, 4), cfg=False)
    assert xl["time_ids"] == ((1, 6), (2, 6), (4, 6)) and xl["text_embeds"][0] == (1, 32)
    with pytest.raises(ValueError, match="batch"):
        tensorrt_profile_shapes(sig, batch=(2, 1, 4))
    with pytest.raises(ValueError, match="image_px"):
        tensorrt_profile_shapes(sig, image_px=(250, 512, 1024))


def test_layer_sensitivity_ranks_groups(onnx_path, calib):
    from fastdiff.engines import layer_sensitivity

    fit, held = calib.split(4)
    result = layer_sensitivity(onnx_path, fit, held.subset(1), method="minmax", max_calibration_records=4)
    groups = {r["group"] for r in result}
    assert {"conv", "qkv", "ffn"} <= groups and not groups & {"attention", "conv_in", "conv_out"}
    snrs = [r["snr_db"] for r in result]
    assert snrs == sorted(snrs) and all(15 < s < 120 for s in snrs)
    assert all(r["num_nodes"] > 0 for r in result)


def test_layer_sensitivity_takes_one_exclusion_regex_as_a_string(onnx_path, calib):
    """exclude="conv_in" is one regex: each of its characters used to be one, excluding nearly every layer."""
    from fastdiff.engines import layer_sensitivity

    fit, held = calib.split(4)
    result = layer_sensitivity(
        onnx_path, fit, held.subset(1), method="minmax", max_calibration_records=2, exclude="conv_in"
    )
    groups = {r["group"] for r in result}
    assert {"conv", "qkv", "ffn", "conv_out"} <= groups and "conv_in" not in groups


def test_layer_sensitivity_releases_its_reference_session(onnx_path, calib, monkeypatch):
    """The fp32 reference session (the whole model's weights and arena: several GB at 512^2) is gone
    before the groups calibrate; ov-mixed at 512^2 ran out of memory with it alive."""
    import weakref

    from fastdiff.engines import sensitivity

    made = []

    class Spy(sensitivity.OrtRunner):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(weakref.ref(self))

    alive = []
    real_quantize = sensitivity.quantize
    monkeypatch.setattr(sensitivity, "OrtRunner", Spy)
    monkeypatch.setattr(
        sensitivity, "quantize", lambda *a, **k: alive.append(made[0]() is not None) or real_quantize(*a, **k)
    )
    fit, held = calib.split(4)
    sensitivity.layer_sensitivity(onnx_path, fit, held.subset(1), method="minmax", max_calibration_records=2)
    assert alive and not any(alive)


# ---------------------------------------------------------------- records on disk (memory-bounded calibration)


def test_calibration_streams_records_to_disk(pipe, calib, onnx_path, tmp_path):
    """save_to writes each record as recorded; the loaded data reads them back one at a time.

    What is exercised: identical records and identical quantised graphs from disk and memory.
    What is not: the peak-memory claim itself, which benchmarks/engines.py measures.
    """
    from fastdiff.engines.records import DiskRecords

    disk = calibrate(pipe, PROMPTS, num_inference_steps=STEPS, guidance_scale=7.5, save_to=tmp_path / "rec")
    assert isinstance(disk.records, DiskRecords) and len(disk) == len(calib)
    assert disk.fingerprint() == calib.fingerprint()
    reopened = CalibrationData.load(tmp_path / "rec")
    assert reopened.meta["num_inference_steps"] == STEPS and reopened.fingerprint() == calib.fingerprint()
    fit, held = reopened.split(4)
    assert isinstance(fit.records, DiskRecords) and isinstance(held.subset(1).records, DiskRecords)
    assert fit.fingerprint() == calib.split(4)[0].fingerprint()
    lazy_file = CalibrationData.load(calib.save(tmp_path / "c.safetensors"), lazy=True)
    assert isinstance(lazy_file.records, DiskRecords) and lazy_file.fingerprint() == calib.fingerprint()
    a = quantize(onnx_path, fit, level="conv", method="minmax", out_path=tmp_path / "a.onnx")
    b = quantize(onnx_path, calib.split(4)[0], level="conv", method="minmax", out_path=tmp_path / "b.onnx")
    r = calib.records[0]
    assert torch.equal(OrtRunner(a)(r), OrtRunner(b)(r))
    with pytest.raises(FileExistsError, match="save_to"):
        calibrate(pipe, PROMPTS[:1], num_inference_steps=1, save_to=tmp_path / "rec")


def test_minmax_ranges_cover_every_record_in_any_order(onnx_path, calib, tmp_path):
    """Ranges are folded record by record: the result is the min/max over all records, whatever the order.

    Regression: with CalibMaxIntermediateOutputs, ORT 1.32's MinMax calibrator discarded each full
    batch instead of merging it, so 9 records calibrated on the last one only.
    """
    fit, _ = calib.split(4)
    assert len(fit) > 8
    reverse = CalibrationData(list(reversed(list(fit.records))), fit.meta)
    caches = []
    for i, data in enumerate((fit, reverse)):
        cache = tmp_path / f"ranges{i}.json"
        quantize(
            onnx_path,
            data,
            level="conv",
            method="minmax",
            out_path=tmp_path / f"{i}.onnx",
            calibration_cache=cache,
        )
        caches.append(json.loads(cache.read_text()))
    assert caches[0] == caches[1]


@pytest.mark.parametrize(
    ("method", "symmetric"), [("percentile", False), ("percentile", True), ("entropy", False)]
)
def test_grouped_histogram_calibration_gives_onnx_runtimes_ranges(
    onnx_path, calib, tmp_path, monkeypatch, method, symmetric
):
    """fastdiff calibrates ORT's tensors a group at a time and a sample at a time (bounded memory);
    the ranges must be the ones ORT's own calibrator computes with every tensor in one session, record
    by record, up to float rounding."""
    import contextlib
    import io

    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from fastdiff.engines import ort_calibration
    from fastdiff.engines.quantization import _QUANTISABLE_OPS, _graph_input_names, preprocess

    pre = preprocess(onnx_path, tmp_path / "pre.onnx")
    records = list(calib.split(4)[0].subset(4).records)
    names = _graph_input_names(pre)
    kind = {"percentile": CalibrationMethod.Percentile, "entropy": CalibrationMethod.Entropy}[method]
    ort_calib = create_calibrator(
        pre,
        list(_QUANTISABLE_OPS),
        augmented_model_path=str(tmp_path / "augmented.onnx"),
        calibrate_method=kind,
        extra_options={"symmetric": symmetric, "percentile": 99.999},
    )
    ort_calib.augment_graph()
    ort_calib.create_inference_session()

    class One:  # ORT's strided calibration: one record per collect_data call
        def __init__(self, r):
            self.left = [{n: r[n].numpy() for n in names}]

        def get_next(self):
            return self.left.pop() if self.left else None

    with contextlib.redirect_stdout(io.StringIO()):
        for r in records:
            ort_calib.collect_data(One(r))
    expected = ort_calib.compute_data()

    groups = []
    real = ort_calibration.group_by_bytes
    monkeypatch.setattr(ort_calibration, "group_by_bytes", lambda *a: groups.append(real(*a)) or groups[-1])
    import onnxruntime

    arenas = []  # the arena kept a 512^2 group's largest intermediates reserved (20 GB peak, 14.5 without)
    batches = set()  # one sample per run: the attention intermediates shrink with the batch
    real_session = onnxruntime.InferenceSession

    class Session:
        def __init__(self, path, options, **kw):
            arenas.append(options.enable_cpu_mem_arena)
            self.inner = real_session(path, options, **kw)
            self.get_inputs = self.inner.get_inputs

        def run(self, outputs, feed):
            batches.update(feed[n].shape[0] for n in ("sample", "encoder_hidden_states") if n in feed)
            return self.inner.run(outputs, feed)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Session)
    for memory_gb in (1e-6, 10.0):  # one tensor per group, then all in one
        got = ort_calibration.histogram_ranges(
            pre,
            records,
            names,
            op_types=_QUANTISABLE_OPS,
            method=method,
            symmetric=symmetric,
            memory_gb=memory_gb,
        )
        assert set(got.keys()) == set(expected.keys()) and len(expected.keys()) > 20
        moved = {}
        for name in expected.keys():
            # Batch-1 kernels round differently from ORT's batch-2 session: 114 of 191 ranges moved
            # by at most 9.6e-7 of their size. A grouping or collection error moves them by far more.
            want = np.asarray(expected[name].range_value)
            err = np.abs(np.asarray(got[name].range_value) - want).max() / np.abs(want).max()
            if err > 4e-6:
                moved[name] = err
        # Histogram ranges are bin edges: rounding can carry one value over an edge and move a range by
        # one bin of ORT's 2048 over +-max|x| (AVX2-only CPU: 1 of 191 moved 9.6e-4 of its size), never
        # many ranges at once nor by more than a bin or two.
        assert len(moved) <= 2 and all(e <= 2 * 2 / 2048 for e in moved.values()), moved
    assert len(groups[0]) > len(expected.keys()) // 2 and len(groups[1]) == 1  # tiny tensors may share
    assert arenas and not any(arenas)
    assert records[0]["sample"].shape[0] == 2 and batches == {1}
    with pytest.raises(ValueError, match="memory_gb must be positive"):
        ort_calibration.histogram_ranges(pre, records, names, op_types=_QUANTISABLE_OPS, memory_gb=0)


def test_calibration_runs_on_the_callers_weights_where_they_equal_the_file(
    pipe, calib, tmp_path, monkeypatch
):
    """compile_engine holds the U-Net while it calibrates; sessions must run on its weights (no second
    copy) where they equal the export's data file (over 2 GB), and on the file where they do not."""
    import onnxruntime

    from fastdiff.engines import ort_calibration
    from fastdiff.engines.quantization import _QUANTISABLE_OPS, _graph_input_names, preprocess

    src = export_onnx(pipe.unet, tmp_path / "unet.onnx", external_data=True)
    pre = preprocess(src, tmp_path / "pre.onnx")
    records = list(calib.subset(2).records)
    names = _graph_input_names(pre)

    def ranges(weights):
        got = ort_calibration.histogram_ranges(
            pre, records, names, op_types=_QUANTISABLE_OPS, weights=weights
        )
        return {n: np.asarray(got[n].range_value) for n in got.keys()}

    baseline = ranges(None)
    views = export_mod.weight_views(pipe.unet)
    given = {}  # initializer name -> data pointer ORT was handed

    class Options(onnxruntime.SessionOptions):
        def add_initializer(self, name, value):
            given[name] = value.data_ptr()
            super().add_initializer(name, value)

    monkeypatch.setattr(onnxruntime, "SessionOptions", Options)
    external = {  # the U-Net's tensors in the data file (small ones stay in the graph, MatMuls transposed)
        i.name
        for i in onnx.load(str(pre), load_external_data=False).graph.initializer
        if i.data_location == onnx.TensorProto.EXTERNAL and i.name in views
    }
    assert len(external) > 40
    poisoned = {**views, "unet.conv_in.weight": views["unet.conv_in.weight"] + 1e-3}
    strided = np.asfortranarray(views["unet.conv_out.weight"])  # equal values, not C order
    assert "unet.conv_out.weight" not in ort_calibration.external_matches(
        onnx.load(str(pre), load_external_data=False), {"unet.conv_out.weight": strided}, pre.parent
    )
    for weights in (views, poisoned):
        given.clear()
        got = ranges(weights)
        assert all(np.array_equal(got[n], baseline[n]) for n in baseline)
        assert set(given) == external - ({"unet.conv_in.weight"} if weights is poisoned else set())
        assert all(given[n] == weights[n].ctypes.data for n in given)  # no copy

    # The sessions compute with the arrays handed over: doubling one after the check moves the ranges.
    copies = {n: a.copy() for n, a in views.items()}
    real = ort_calibration.external_matches

    def then_double(*a, **kw):
        found = real(*a, **kw)
        found["unet.conv_in.weight"] *= 2
        return found

    monkeypatch.setattr(ort_calibration, "external_matches", then_double)
    assert any(not np.array_equal(a, baseline[n]) for n, a in ranges(copies).items())


def test_calibration_sizes_every_tensor_as_onnx_runtime_allocates_it(pipe, calib, tmp_path):
    """Groups are sized from inferred shapes; ONNX's inference left most U-Net activations unsized
    (Shape/Reshape arithmetic), so a 1 GB budget fetched 2.4 GB at 512^2. Every calibrated tensor must
    be sized, at a record's real shape (not the export's), exactly as large as ORT makes it."""
    from fastdiff.engines import ort_calibration
    from fastdiff.engines.quantization import _QUANTISABLE_OPS, _graph_input_names, preprocess

    src = export_onnx(pipe.unet, tmp_path / "unet.onnx", external_data=True)
    pre = preprocess(src, tmp_path / "pre.onnx")
    model = onnx.load(str(pre), load_external_data=False)
    names = ort_calibration.tensors_to_calibrate(onnx.shape_inference.infer_shapes(model), _QUANTISABLE_OPS)
    record = calib.records[0]
    inputs = _graph_input_names(pre)
    record = {**record, "sample": torch.randn(2, record["sample"].shape[1], 24, 40)}  # not the export's shape
    sizes = ort_calibration.tensor_bytes(model, {n: tuple(record[n].shape) for n in inputs}, pre.parent)
    part = tmp_path / "all.onnx"
    onnx.save(ort_calibration.pruned_graph(onnx.shape_inference.infer_shapes(model), names), str(part))
    import onnxruntime

    session = onnxruntime.InferenceSession(str(part), providers=["CPUExecutionProvider"])
    feed = {i.name: record[i.name].numpy().astype(np.float32) for i in session.get_inputs()}
    actual = dict(zip(names, session.run(names, feed)))
    assert len(names) > 20
    assert {n: sizes.get(n) for n in names} == {n: actual[n].nbytes for n in names}


@pytest.mark.parametrize("external", [False, True])
def test_preprocess_writes_the_graph_onnx_runtimes_pre_process_writes(pipe, tmp_path, external):
    """preprocess() keeps only the optimisation step of ORT's quant_pre_process (its shape inference
    and Python load/save cost 25 s at 256^2): the nodes and weights must be the ones ORT's writes."""
    import contextlib
    import io

    from onnxruntime.quantization.quant_utils import model_has_pre_process_metadata
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from fastdiff.engines.quantization import preprocess

    src = export_onnx(pipe.unet, tmp_path / "unet.onnx", external_data=external)
    with contextlib.redirect_stdout(io.StringIO()):
        quant_pre_process(
            str(src),
            str(tmp_path / "ort.onnx"),
            skip_symbolic_shape=True,
            save_as_external_data=external,
            all_tensors_to_one_file=True,
            external_data_location="ort.onnx.data",
        )
    ours = preprocess(src, tmp_path / "pre.onnx")
    assert (tmp_path / "pre.onnx.data").exists() == external
    a, b = onnx.load(str(tmp_path / "ort.onnx")), onnx.load(str(ours))
    assert len(a.graph.node) > 50
    assert [(n.op_type, list(n.input), list(n.output)) for n in a.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in b.graph.node
    ]
    got = {i.name: onnx.numpy_helper.to_array(i) for i in b.graph.initializer}
    assert got.keys() == {i.name for i in a.graph.initializer}
    for i in a.graph.initializer:
        assert np.array_equal(onnx.numpy_helper.to_array(i), got[i.name]), i.name
    assert model_has_pre_process_metadata(b)  # quantize_static warns on a graph without the mark


def test_int8_calibrates_only_what_quantised_layers_read(onnx_path, calib, tmp_path):
    """quantize() leaves the attention matmuls' activations (never quantised, 1 GB each at 512^2) out
    of calibration; the Q/DQ graph must be the one that ranges for every tensor give, and a cache
    without a needed tensor is an error, not a layer silently left in float."""
    from onnxruntime.quantization.calibrate import save_tensors_data

    from fastdiff.engines import ort_calibration
    from fastdiff.engines.quantization import (
        _QUANTISABLE_OPS,
        _graph_input_dtypes,
        _graph_input_names,
        activation_tensors,
        preprocess,
    )

    pre = preprocess(onnx_path, tmp_path / "pre.onnx")
    records = list(calib.subset(4).records)
    every = ort_calibration.histogram_ranges(
        pre, records, _graph_input_names(pre), op_types=_QUANTISABLE_OPS, dtypes=_graph_input_dtypes(pre)
    )
    save_tensors_data(every, tmp_path / "every.json")
    attention = [n for n, c in classify_nodes(pre).items() if c == "attention"]
    skipped = activation_tensors(pre, attention) - activation_tensors(pre)
    assert attention and skipped
    kw = dict(level="conv+ffn+qkv", max_calibration_records=4)
    reference = quantize(
        pre, calib, out_path=tmp_path / "ref.onnx", calibration_cache=tmp_path / "every.json", **kw
    )
    lean = quantize(pre, calib, out_path=tmp_path / "lean.onnx", **kw)
    a, b = onnx.load(str(reference)), onnx.load(str(lean))
    assert [(n.op_type, list(n.input)) for n in a.graph.node] == [
        (n.op_type, list(n.input)) for n in b.graph.node
    ]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in b.graph.initializer}
    for i in a.graph.initializer:
        assert np.array_equal(onnx.numpy_helper.to_array(i), inits[i.name]), i.name

    partial = {k: v for k, v in every.data.items() if k not in skipped}
    save_tensors_data(type(every)(every.calibration_method, partial), tmp_path / "partial.json")
    with pytest.raises(ValueError, match="has no ranges for"):
        quantize(
            pre,
            calib,
            nodes=attention,
            calibration_cache=tmp_path / "partial.json",
            out_path=tmp_path / "x.onnx",
        )


def test_calibration_groups_stay_within_the_budget():
    from fastdiff.engines.ort_calibration import group_by_bytes

    sizes = {"a": 4, "b": 4, "c": 9, "d": 1}
    assert group_by_bytes(["a", "b", "c", "d", "e"], sizes, 8) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert group_by_bytes(["a", "b", "c", "d"], sizes, 100) == [["a", "b", "c", "d"]]


def test_calibration_runs_one_sample_at_a_time_along_the_graphs_batch_axis(onnx_path):
    """The inputs on the first input's symbolic batch axis are cut into views, one per sample; the
    others (a scalar timestep) go whole to every part; disagreeing batch sizes are not cut."""
    from fastdiff.engines.ort_calibration import batch_inputs, per_sample

    model = onnx.load(str(onnx_path), load_external_data=False)
    batched = batch_inputs(model)
    assert {"sample", "encoder_hidden_states"} <= batched
    x, ctx, t = np.random.randn(3, 4, 8, 8), np.random.randn(3, 7, 16), np.asarray(5.0)
    parts = per_sample(
        {"sample": x, "encoder_hidden_states": ctx, "timestep": t}, {"sample", "encoder_hidden_states"}
    )
    assert len(parts) == 3
    for i, part in enumerate(parts):
        assert np.array_equal(part["sample"], x[i : i + 1]) and np.shares_memory(part["sample"], x)
        assert np.array_equal(part["encoder_hidden_states"], ctx[i : i + 1]) and part["timestep"] is t
    assert (
        len(per_sample({"sample": x, "encoder_hidden_states": ctx[:2]}, {"sample", "encoder_hidden_states"}))
        == 1
    )
    assert len(per_sample({"sample": x[:1]}, {"sample"})) == 1
    static = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
        )
    )
    assert batch_inputs(static) == set()


# ---------------------------------------------------------------- TensorRT fixes (no TensorRT here: stand-ins)


def test_tensorrt_cfg_follows_the_records_and_the_unet(pipe, calib):
    """Batch-1 pipelines (guidance <= 1, LCM) get a profile that starts at batch 1."""
    from fastdiff.engines.runtime_trt import uses_cfg

    sig = unet_signature(pipe.unet)
    assert uses_cfg(calib, sig) is True  # recorded with guidance 7.5
    no_cfg = CalibrationData(calib.records[:1], {**calib.meta, "guidance_scale": 1.0})
    assert uses_cfg(no_cfg, sig) is False
    lcm = type(sig)(**{**sig.__dict__, "time_cond_dim": 16})
    assert uses_cfg(None, lcm) is False and uses_cfg(calib, lcm) is False
    assert uses_cfg(None, sig) is True
    shapes = tensorrt_profile_shapes(sig, batch=(1, 1, 4), cfg=uses_cfg(no_cfg, sig))
    assert shapes["sample"][0][0] == 1


def test_tensorrt_out_of_profile_shape_is_a_clear_error():
    """What is exercised: TrtRunner._set_shape with a stand-in context whose set_input_shape returns
    False, as TensorRT's does for a shape outside the profile. What is not: a real engine."""
    import types

    from fastdiff.engines.runtime_trt import TrtRunner

    runner = object.__new__(TrtRunner)
    runner.context = types.SimpleNamespace(set_input_shape=lambda name, shape: shape[0] <= 8)
    runner.engine = types.SimpleNamespace(
        get_tensor_profile_shape=lambda name, i: [(2, 4, 32, 32), (2, 4, 64, 64), (8, 4, 128, 128)]
    )
    runner._set_shape("sample", (8, 4, 64, 64))  # inside: no error
    with pytest.raises(ValueError, match=r"'sample'.*\(16, 4, 64, 64\).*max \(8, 4, 128, 128\)"):
        runner._set_shape("sample", (16, 4, 64, 64))


def test_configs_normalise_and_old_keywords_are_gone(pipe):
    from fastdiff.engines import ExportConfig

    assert QuantConfig(exclude="conv_in").exclude == ("conv_in",)
    assert ExportConfig(dynamic="batch").dynamic == ("batch",)
    with pytest.raises(
        ValueError, match=r"bias_correction must be one of \['fast', 'full', 'none'\], got 'slow'"
    ):
        QuantConfig(bias_correction="slow")
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(ValueError, match=r"calibration_memory_gb must be a positive number"):
            QuantConfig(calibration_memory_gb=bad)
    with pytest.raises(TypeError, match="min_snr_db"):
        compile_engine(pipe, min_snr_db=10)  # settings live in GateConfig / QuantConfig / ...


@pytest.mark.parametrize("threads", [-1, 0, 2.0, "2", True])
def test_bad_thread_counts_fail_before_any_work(pipe, threads, count_exports, monkeypatch):
    """#16: a bad thread count is refused naming ``threads`` and what is valid, before export or build."""
    from fastdiff.engines import RuntimeConfig
    from fastdiff.engines.runtime_ov import OvRunner

    with pytest.raises(ValueError, match=r"threads must be a positive int .* got"):
        RuntimeConfig(threads=threads)
    # Runners constructed directly check it too (the model path is never opened).
    for runner in (OrtRunner, OvRunner):
        with pytest.raises(ValueError, match="threads"):
            runner("/nonexistent/engine", threads=threads)
    # compile_engine takes thread counts only through RuntimeConfig; a stray keyword names itself.
    with pytest.raises(TypeError, match="threads"):
        compile_engine(pipe, threads=threads)
    with pytest.raises(TypeError, match="runtime must be a fastdiff.engines.RuntimeConfig"):
        compile_engine(pipe, runtime={"threads": threads})
    assert count_exports == []
    assert RuntimeConfig(threads=1).threads == 1 and RuntimeConfig().threads is None


@pytest.mark.parametrize("damage", ["truncated", "not-safetensors", "truncated-record"])
def test_damaged_calibration_file_names_its_path(calib, tmp_path, damage):
    """#16: a truncated or foreign calibration file raises ValueError naming the file, not SafetensorError."""
    if damage == "truncated-record":  # one record of a calibrate(save_to=...) folder, read lazily
        folder = tmp_path / "records"
        folder.mkdir()
        from fastdiff.engines.records import RecordSpill

        spill = RecordSpill(folder)
        for r in calib.subset(2):
            spill.append(r)
        bad = sorted(folder.glob("*.safetensors"))[1]
        bad.write_bytes(bad.read_bytes()[:-64])
        data = CalibrationData.load(folder)
        assert len(data) == 2 and data.records[0]["sample"].shape == calib.records[0]["sample"].shape
        with pytest.raises(ValueError, match=str(bad)):
            data.records[1]
        return
    path = tmp_path / "calib.safetensors"
    calib.save(path)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else b"PK\x03\x04 a zip, not records")
    for lazy in (False, True):
        with pytest.raises(ValueError, match=str(path)):
            CalibrationData.load(path, lazy=lazy)
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        CalibrationData.load(tmp_path / "missing.safetensors")


def test_cache_is_found_again_by_another_process(tmp_path):
    """Regression: the key held diffusers' ``_use_default_values``, a list in set order, which changes with
    Python's hash seed, so a second process never found the first one's engine."""
    import os
    import subprocess
    import sys

    script = (
        "import sys; from fastdiff.engines import compile_engine; from fastdiff.testing import tiny_pipeline; "
        "unet = tiny_pipeline('sd15', size='tiny', seed=0).unet; "
        "assert len(unet.config.get('_use_default_values', [])) > 1; "
        f"e = compile_engine(unet, precision='fp32', cache_dir={str(tmp_path)!r}); print('HIT', e.cache_hit)"
    )
    hits = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        hits.append(out.stdout.strip().splitlines()[-1])
    assert hits == ["HIT False", "HIT True"]
