"""Record real U-Net inputs from pipeline runs for INT8 calibration and quality checks.

Activation ranges in a diffusion U-Net move a lot with the timestep (early, noisy
steps and late, clean steps see very different statistics), so calibration data
must cover the whole trajectory. Following NVIDIA Model Optimizer's recipe we run
the actual pipeline over a set of prompts and record, at every step, exactly what
the U-Net receives: the latent batch (including both halves of the CFG pair), the
timestep, the text embeddings and any added conditioning (SDXL).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from ..unet_inputs import unet_signature
from .records import DiskRecords, RecordSpill, open_records_file


@dataclasses.dataclass
class CalibrationData:
    """U-Net inputs recorded step by step; each record maps flat input names to CPU float32 tensors.

    Every record carries a batch dimension (the timestep is broadcast to it), so a
    record can be fed directly to an exported ONNX graph.
    """

    records: Sequence[dict[str, torch.Tensor]]  # a list, or DiskRecords read one at a time
    meta: dict = dataclasses.field(default_factory=dict)

    def _take(self, indices: Sequence[int]) -> CalibrationData:
        if isinstance(self.records, DiskRecords):
            return CalibrationData(self.records.take(indices), dict(self.meta))
        return CalibrationData([self.records[i] for i in indices], dict(self.meta))

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self.records)

    @property
    def timesteps(self) -> list[float]:
        return [float(r["timestep"].flatten()[0]) for r in self.records]

    def split(self, holdout_every: int = 4) -> tuple[CalibrationData, CalibrationData]:
        """(calibration, held-back) split: every ``holdout_every``-th record is held back.

        Interleaving keeps both parts spread over all timesteps and prompts.
        """
        if holdout_every < 2:
            raise ValueError(f"holdout_every must be >= 2, got {holdout_every}")
        if len(self.records) < 2:
            raise ValueError("need at least 2 records to split calibration data")
        n = len(self.records)
        held = [i for i in range(n) if i % holdout_every == holdout_every - 1]
        kept = [i for i in range(n) if i % holdout_every != holdout_every - 1]
        if not held:
            held, kept = kept[-1:], kept[:-1]
        return self._take(kept), self._take(held)

    def subset(self, max_records: int | None) -> CalibrationData:
        """At most ``max_records`` records spread evenly over the sequence (hence over timesteps); None: all."""
        n = len(self.records)
        if max_records is None or max_records >= n:
            return self
        idx = sorted({round(i * (n - 1) / max(max_records - 1, 1)) for i in range(max_records)})
        return self._take(idx)

    def fingerprint(self) -> str:
        """sha256 over every recorded tensor (used in engine cache keys)."""
        import hashlib

        h = hashlib.sha256()
        for r in self.records:
            for k in sorted(r):
                t = r[k].contiguous()
                h.update(k.encode())
                h.update(str(tuple(t.shape)).encode())
                h.update(t.numpy().tobytes())
        return h.hexdigest()

    def save(self, path: str | os.PathLike) -> Path:
        """Write to a ``.safetensors`` file (no pickle), meta in its header."""
        from safetensors.torch import save_file

        tensors = {f"{i:06d}.{k}": v.contiguous() for i, r in enumerate(self.records) for k, v in r.items()}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata={"fastdiff_calibration": json.dumps(self.meta)})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, lazy: bool = False) -> CalibrationData:
        """Read a file written by :meth:`save`, or a folder written by ``calibrate(save_to=...)``.

        ``lazy=True`` (always for a folder) keeps the records on disk and reads each when used.
        """
        if Path(path).is_dir():
            meta_file = Path(path) / "meta.json"
            meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
            return cls(DiskRecords.from_dir(path), meta)
        records: dict[int, dict[str, torch.Tensor]] = {}
        with open_records_file(path) as f:
            meta_raw = (f.metadata() or {}).get("fastdiff_calibration")
            if meta_raw is None:
                raise ValueError(
                    f"{path} is not a fastdiff calibration file (no 'fastdiff_calibration' metadata)"
                )
            if not lazy:
                for key in f.keys():
                    index, name = key.split(".", 1)
                    records.setdefault(int(index), {})[name] = f.get_tensor(key)
        if lazy:
            return cls(DiskRecords.from_file(path), json.loads(meta_raw))
        return cls([records[i] for i in sorted(records)], json.loads(meta_raw))


class UNetInputRecorder:
    """Context manager that records every U-Net call's inputs via a forward pre-hook."""

    def __init__(self, unet: torch.nn.Module, save_to: str | os.PathLike | None = None):
        self.unet = unet
        self._spill = RecordSpill(save_to) if save_to is not None else None
        self._kept: list[dict[str, torch.Tensor]] = []
        self._signature = inspect.signature(unet.forward)
        self._flat = unet_signature(unet)
        self._handle = None

    def _hook(self, module, args, kwargs):
        """Records the call's arguments as flat, batch-first CPU float32 copies."""
        call = self._signature.bind(*args, **kwargs).arguments
        flat = self._flat.to_flat(
            call["sample"],
            call["timestep"],
            call["encoder_hidden_states"],
            timestep_cond=call.get("timestep_cond"),
            added_cond_kwargs=call.get("added_cond_kwargs"),
        )
        copies = {k: v.detach().to("cpu", torch.float32).clone() for k, v in flat.items()}
        (self._spill or self._kept).append(copies)

    @property
    def records(self):
        """The records so far: a list, or :class:`DiskRecords` when spilling to ``save_to``."""
        return self._spill.records() if self._spill is not None else self._kept

    def __enter__(self):
        self._handle = self.unet.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False


def calibrate(
    pipe,
    prompts: Sequence[str],
    num_inference_steps: int = 20,
    guidance_scale: float = 7.5,
    *,
    negative_prompt: str | None = None,
    height: int | None = None,
    width: int | None = None,
    prompts_per_batch: int = 1,
    seed: int = 0,
    save_to: str | os.PathLike | None = None,
    progress: bool = True,
    **pipe_kwargs,
) -> CalibrationData:
    """Run ``pipe`` over ``prompts`` and record the U-Net's inputs at every step.

    With ``guidance_scale > 1`` each record holds the CFG pair (batch ``2 * prompts_per_batch``).
    The pipeline runs with ``output_type="latent"`` (the VAE decode is not needed).

    Returns ``CalibrationData`` with ``len(prompts) / prompts_per_batch * num_inference_steps`` records
    (for schedulers that evaluate the U-Net once per step).

    ``save_to``: a new folder; each record is written there as it is recorded and read back one
    at a time later, so memory stays flat however many prompts and steps are recorded
    (``CalibrationData.load(save_to)`` reopens it). ``progress``: a tqdm bar over prompt batches.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("calibrate needs at least one prompt")
    if num_inference_steps < 1:
        raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
    if prompts_per_batch < 1:
        raise ValueError(f"prompts_per_batch must be >= 1, got {prompts_per_batch}")
    unet = getattr(pipe, "unet", None)
    if not isinstance(unet, torch.nn.Module):
        raise TypeError(f"calibrate needs a diffusers pipeline with a .unet, got {type(pipe).__name__}")
    signature = unet_signature(unet)
    from tqdm.auto import tqdm

    sizes = {k: v for k, v in (("height", height), ("width", width)) if v is not None}  # else the pipeline's
    starts = range(0, len(prompts), prompts_per_batch)
    with UNetInputRecorder(unet, save_to) as recorder, torch.no_grad():
        for start in tqdm(starts, desc="fastdiff calibrate", unit="batch", disable=not progress, leave=False):
            chunk = prompts[start : start + prompts_per_batch]
            kwargs = dict(
                prompt=chunk,
                num_inference_steps=num_inference_steps,
                guidance_scale=guidance_scale,
                generator=torch.Generator("cpu").manual_seed(seed + start),
                output_type="latent",
                **sizes,
            )
            if negative_prompt is not None:
                kwargs["negative_prompt"] = [negative_prompt] * len(chunk)
            pipe(**(kwargs | pipe_kwargs))
    meta = {
        "num_prompts": len(prompts),
        "num_inference_steps": num_inference_steps,
        "guidance_scale": guidance_scale,
        "prompts_per_batch": prompts_per_batch,
        "seed": seed,
        "scheduler": type(pipe.scheduler).__name__,
        "input_names": list(signature.input_names),
    }
    if save_to is not None:
        (Path(save_to) / "meta.json").write_text(json.dumps(meta))
    return CalibrationData(recorder.records, meta)


def synthetic_inputs(
    unet, num: int = 4, batch: int = 2, height=None, width=None, seed: int = 0, sequence_length: int = 77
) -> CalibrationData:
    """Random inputs spread over timesteps, for quality checks when no calibration data is given.

    Latents are unit Gaussians (what the sampler feeds at high noise), text embeddings
    unit Gaussians; real recorded inputs are always preferable.
    """
    sig = unet_signature(unet)
    h = height or sig.sample_size
    w = width or sig.sample_size
    gen = torch.Generator().manual_seed(seed)
    records = []
    for i in range(num):
        r = sig.example_inputs(batch, h, w, sequence_length, generator=gen)
        r["timestep"] = torch.full((batch,), float(round(999 * (i + 0.5) / num)))
        records.append(r)
    return CalibrationData(records, {"synthetic": True, "input_names": list(sig.input_names)})
