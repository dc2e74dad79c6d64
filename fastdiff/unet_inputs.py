"""One description of what a diffusers ``UNet2DConditionModel`` takes.

:class:`UNetSignature` (read from the U-Net's config by :func:`unet_signature`) converts between
the diffusers call (``sample, timestep, encoder_hidden_states, timestep_cond=..., added_cond_kwargs=...``)
and the *flat* form that engines, calibration records and ONNX graphs use: a dict of batch-first
tensors named by :attr:`UNetSignature.input_names`::

    sample                 (B, C, H, W)
    timestep               (B,)        broadcast from a scalar
    encoder_hidden_states  (B, S, D)
    timestep_cond          (B, Dc)     only if config.time_cond_proj_dim (LCM)
    text_embeds            (B, Dt)     only for SDXL ("text_time" added conditioning)
    time_ids               (B, 6)      only for SDXL

It also makes random inputs: :meth:`UNetSignature.example_inputs` (flat, realistic scales) and
:func:`probe_inputs` (diffusers keyword arguments, the smallest valid size; what ``optimize``
verifies passes on).

Imports nothing but torch: no onnx, onnxruntime or pipeline classes.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class UNetSignature:
    """Shapes of the flat inputs of a U-Net, read from its config."""

    in_channels: int
    out_channels: int
    sample_size: int
    cross_attention_dim: int
    text_embeds_dim: int | None = None  # SDXL pooled text embedding width
    time_ids_dim: int | None = None  # SDXL micro-conditioning (6 numbers)
    time_cond_dim: int | None = None  # LCM guidance embedding width
    num_levels: int = 4  # len(block_out_channels): how often the sample is downsampled (+1)

    @property
    def input_names(self) -> tuple[str, ...]:
        names = ["sample", "timestep", "encoder_hidden_states"]
        if self.time_cond_dim is not None:
            names.append("timestep_cond")
        if self.text_embeds_dim is not None:
            names += ["text_embeds", "time_ids"]
        return tuple(names)

    @property
    def is_sdxl(self) -> bool:
        return self.text_embeds_dim is not None

    def to_flat(
        self,
        sample: torch.Tensor,
        timestep,
        encoder_hidden_states: torch.Tensor,
        timestep_cond: torch.Tensor | None = None,
        added_cond_kwargs: dict | None = None,
    ) -> dict[str, torch.Tensor]:
        """The flat inputs of one diffusers U-Net call (tensors as given; the timestep as float32 (B,)).

        Raises ``ValueError`` naming the input when one this U-Net needs is missing or has the wrong batch.
        """
        if not isinstance(sample, torch.Tensor) or sample.ndim != 4 or sample.shape[1] != self.in_channels:
            got = tuple(sample.shape) if isinstance(sample, torch.Tensor) else type(sample).__name__
            raise ValueError(f"sample must be a (batch, {self.in_channels}, height, width) tensor, got {got}")
        batch = sample.shape[0]
        if encoder_hidden_states.ndim != 3 or encoder_hidden_states.shape[0] != batch:
            raise ValueError(
                f"encoder_hidden_states must have shape ({batch}, tokens, {self.cross_attention_dim}), "
                f"got {tuple(encoder_hidden_states.shape)}"
            )
        flat = {
            "sample": sample,
            "timestep": timestep_batch(timestep, batch),
            "encoder_hidden_states": encoder_hidden_states,
        }
        if self.time_cond_dim is not None:
            if timestep_cond is None:
                raise ValueError("this U-Net needs timestep_cond (time_cond_proj_dim is set)")
            flat["timestep_cond"] = timestep_cond
        if self.is_sdxl:
            added = added_cond_kwargs or {}
            if "text_embeds" not in added or "time_ids" not in added:
                raise ValueError("this SDXL U-Net needs added_cond_kwargs with 'text_embeds' and 'time_ids'")
            flat["text_embeds"] = added["text_embeds"]
            time_ids = added["time_ids"]
            flat["time_ids"] = time_ids.expand(batch, -1) if time_ids.shape[0] == 1 else time_ids
        for name, value in flat.items():
            if value.shape[0] != batch:
                raise ValueError(f"{name} has batch {value.shape[0]}, sample has {batch}")
        return flat

    def check_flat(self, flat: dict[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` saying what differs when ``flat`` (a record) was not made for this U-Net.

        Names must be exactly :attr:`input_names`, and the widths the config fixes must agree: the
        sample's channels, the text width, and the LCM / SDXL conditioning widths.
        """
        names = set(flat)
        if names != set(self.input_names):
            extra, missing = sorted(names - set(self.input_names)), sorted(set(self.input_names) - names)
            raise ValueError(
                f"inputs {sorted(names)} are not this U-Net's {list(self.input_names)} "
                f"(extra {extra}, missing {missing})"
            )
        widths = {
            "sample": (1, self.in_channels, "in_channels"),
            "encoder_hidden_states": (-1, self.cross_attention_dim, "cross_attention_dim"),
            "timestep_cond": (-1, self.time_cond_dim, "time_cond_proj_dim"),
            "text_embeds": (-1, self.text_embeds_dim, "the pooled text width"),
            "time_ids": (-1, self.time_ids_dim, "time_ids"),
        }
        for name, (dim, want, what) in widths.items():
            if name in flat and (flat[name].ndim < 2 or flat[name].shape[dim] != want):
                raise ValueError(
                    f"{name} has shape {tuple(flat[name].shape)}; this U-Net's {what} is {want} "
                    f"(dimension {dim} must equal it)"
                )

    def from_flat(self, flat: dict[str, torch.Tensor]) -> dict:
        """Keyword arguments for ``unet(**kwargs, return_dict=False)`` from flat inputs."""
        missing = [n for n in self.input_names if n not in flat]
        if missing:
            raise ValueError(f"flat inputs lack {missing}; this U-Net takes {list(self.input_names)}")
        added = {"text_embeds": flat["text_embeds"], "time_ids": flat["time_ids"]} if self.is_sdxl else None
        return {
            "sample": flat["sample"],
            "timestep": flat["timestep"],
            "encoder_hidden_states": flat["encoder_hidden_states"],
            "timestep_cond": flat.get("timestep_cond"),
            "added_cond_kwargs": added,
        }

    def example_inputs(
        self, batch: int, height: int, width: int, sequence: int = 77, generator=None
    ) -> dict[str, torch.Tensor]:
        """Random flat float32 inputs with realistic scales (unit latents and text, t = 500)."""
        g = generator
        inputs = {
            "sample": torch.randn(batch, self.in_channels, height, width, generator=g),
            "timestep": torch.full((batch,), 500.0),
            "encoder_hidden_states": torch.randn(batch, sequence, self.cross_attention_dim, generator=g),
        }
        if self.time_cond_dim is not None:
            inputs["timestep_cond"] = torch.randn(batch, self.time_cond_dim, generator=g)
        if self.text_embeds_dim is not None:
            inputs["text_embeds"] = torch.randn(batch, self.text_embeds_dim, generator=g)
            inputs["time_ids"] = torch.tensor(
                [[height * 8.0, width * 8.0, 0.0, 0.0, height * 8.0, width * 8.0]]
            ).repeat(batch, 1)
        return inputs


def timestep_batch(timestep, batch: int) -> torch.Tensor:
    """int, float, 0-d or 1-d tensor -> float32 CPU tensor of shape (batch,)."""
    if isinstance(timestep, bool) or not isinstance(timestep, (int, float, torch.Tensor)):
        raise TypeError(f"timestep must be an int, float or tensor, got {type(timestep).__name__}")
    t = torch.as_tensor(timestep).detach().to("cpu", torch.float32)
    if t.ndim == 0 or t.numel() == 1:
        return t.reshape(1).expand(batch)
    if t.ndim != 1 or t.shape[0] != batch:
        raise ValueError(f"timestep must be a scalar or have shape ({batch},), got shape {tuple(t.shape)}")
    return t


def unet_signature(unet, strict: bool = True) -> UNetSignature:
    """Read the flat input signature from a ``UNet2DConditionModel``'s config.

    Raises ``ValueError`` for conditioning the flat signature cannot express (class labels, image
    embeddings, per-block cross-attention widths) unless ``strict=False`` (probing only: the first
    width is taken and the extra conditioning left out).
    """
    config = getattr(unet, "config", None)
    if config is None or not hasattr(config, "in_channels"):
        raise TypeError(
            f"expected a diffusers UNet2DConditionModel (with a .config), got {type(unet).__name__}"
        )
    cross = config.cross_attention_dim
    if isinstance(cross, (list, tuple)):
        if strict and len(set(cross)) != 1:
            raise ValueError(f"per-block cross_attention_dim {cross} is not supported by the flat signature")
        cross = cross[0]
    if strict and (
        getattr(config, "class_embed_type", None) is not None or getattr(config, "num_class_embeds", None)
    ):
        raise ValueError("U-Nets with class-label conditioning are not supported by the flat signature")
    add_type = getattr(config, "addition_embed_type", None)
    text_embeds_dim = time_ids_dim = None
    if add_type == "text_time":
        time_ids_dim = 6
        text_embeds_dim = (
            config.projection_class_embeddings_input_dim - time_ids_dim * config.addition_time_embed_dim
        )
    elif add_type is not None and strict:
        raise ValueError(
            f"addition_embed_type={add_type!r} is not supported by the flat signature (supported: None, 'text_time')"
        )
    return UNetSignature(
        in_channels=config.in_channels,
        out_channels=config.out_channels,
        sample_size=config.sample_size if isinstance(config.sample_size, int) else config.sample_size[0],
        cross_attention_dim=int(cross),
        text_embeds_dim=text_embeds_dim,
        time_ids_dim=time_ids_dim,
        time_cond_dim=getattr(config, "time_cond_proj_dim", None),
        num_levels=len(config.block_out_channels),
    )


def probe_inputs(
    unet, batch: int = 2, size: int | None = None, seq_len: int = 8, seed: int = 0, device=None, dtype=None
) -> dict:
    """Small valid keyword arguments for ``unet(**inputs)``, derived from the U-Net's config.

    The spatial size defaults to the smallest one that survives every downsampling twice over, so
    the probe is cheap but still exercises each block's real code path. SDXL ``text_time``
    conditioning and LCM's ``time_cond_proj_dim`` get matching extra inputs. The timestep is a
    0-d tensor (537), as pipelines pass it.
    """
    sig = unet_signature(unet, strict=False)
    device = device if device is not None else unet.device
    dtype = dtype if dtype is not None else unet.dtype
    if size is None:
        size = max(8, 2**sig.num_levels)
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    inputs = {
        "sample": randn(batch, sig.in_channels, size, size),
        "timestep": torch.tensor(537, device=device),
        "encoder_hidden_states": randn(batch, seq_len, sig.cross_attention_dim),
    }
    if sig.is_sdxl:
        inputs["added_cond_kwargs"] = {
            "text_embeds": randn(batch, sig.text_embeds_dim),
            "time_ids": torch.tensor(
                [[size * 8, size * 8, 0, 0, size * 8, size * 8]] * batch, device=device
            ).to(dtype),
        }
    if sig.time_cond_dim is not None:
        inputs["timestep_cond"] = randn(batch, sig.time_cond_dim)
    return inputs
