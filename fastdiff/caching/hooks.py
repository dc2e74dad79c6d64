"""The U-Net hooks and unit wrappers: where a call becomes full or cached, and features are kept or replayed.

A forward pre-hook on the U-Net (:meth:`CallHooks._pre_hook`) finds the call's step and slot and decides the
call's path before any unit runs; each replayable unit's ``forward`` is wrapped (:meth:`CallHooks._unit_forward`)
to keep its output on full calls and return it on cached ones; cross-attentions are wrapped for gating
(:meth:`CallHooks._gate_forward`); the post-hook counts the call. :meth:`CallHooks.remove` puts every
original ``forward`` back.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HANDLE_ATTR = "_fastdiff_step_cache"


def installed_cache(pipe_or_unet):
    """The step cache installed on a U-Net (or on a pipeline's ``.unet``), or None."""
    return vars(getattr(pipe_or_unet, "unet", pipe_or_unet)).get(HANDLE_ATTR)


class CallHooks:
    """Hooks and wrappers of :class:`~fastdiff.caching.cache.StepCache` (mixed in)."""

    def _pre_hook(self, module, args, kwargs):
        for name in ("down_block_additional_residuals", "mid_block_additional_residual"):
            if kwargs.get(name) is not None and self.enabled and self.mode != "off":
                raise NotImplementedError(
                    f"step_cache does not support ControlNet residuals ({name}); fastdiff.restore the cache first"
                )
        if (
            kwargs.get("down_intrablock_additional_residuals") is not None
            and self.enabled
            and self.mode != "off"
        ):
            raise NotImplementedError("step_cache does not support T2I-Adapter residuals")
        sample = args[0] if args else kwargs["sample"]
        t = args[1] if len(args) > 1 else kwargs["timestep"]
        if self._external is not None:  # announced by begin_step: nothing data-dependent in the traced call
            key, tvals = self._external, (self._external[1],)
            repeat = key == self._last_key
        else:
            tvals = tuple(torch.as_tensor(t).detach().flatten().tolist())
            key = tvals
            # A repeated timestep is another call of the same step, unless every call slot of a step has
            # been seen (PNDM evaluates its first timestep twice as two steps).
            repeat = key == self._last_key and (
                self._calls_per_step is None or self._slot + 1 < self._calls_per_step
            )
        if not repeat:
            if self._last_t is not None and max(tvals) > max(self._last_t):
                self._clear_run()  # a larger timestep: a new run
            if self._step == 0 and self._calls_per_step is None:
                self._calls_per_step = self._slot + 1
            if self._step < 0:
                self._check_units()
                self.stats.runs += 1
                self._run_serial += 1
                self.stats.trace = []
                self.stats.run_calls = [0, 0, 0]
            self._last_key, self._last_t = key, tvals
            self._step += 1
            self._slot = 0
            self._accum_step = False
            self._locate(tvals)
            self._fc_s = self._fc_position(tvals)
            self._step_full = self._decide_full()
            self.stats.steps += 1
            self.stats.trace.append({"step": self._step, "t": tvals[0], "full": self._step_full})
        else:
            self._slot += 1
        while len(self._slots) <= self._slot:
            self._slots.append({})
            self._gate.append({})
            self._slot_batch.append(None)
            self._probe_prev.append(None)
            self._fc_nodes.append([])
        batch = sample.shape[0]
        if self._first_batch is None:  # the first call since the rows hook was (re)armed covers every row
            self._first_batch = batch
        self._gating = (
            self.enabled
            and self.gate_step is not None
            and self._step > self.gate_step
            and not (self.run_length is not None and self._step >= self.run_length - 1)
            and self._slot_batch[self._slot] in (batch, batch // 2)
        )
        self._halved = False
        if self._gating and self.gate_uncond and self._is_guidance_pair(sample, t):
            args, kwargs = self._halve(args, kwargs, batch)
            batch //= 2
        self._gating = self._gating and self._slot_batch[self._slot] == batch
        matches = self._slot_batch[self._slot] == batch
        if self._step_full is True:
            self._call = "full"
        elif not matches:
            self._call = "full"
            self.stats.forced_refreshes += 1
            self.stats.run_calls[2] += 1
        else:
            self._call = "cached" if self._step_full is False else "probe"
        self._fc_prepare()
        self._slot_batch[self._slot] = batch
        self.stats.unet_calls += 1
        self.stats.gated_calls += self._gating
        self.stats.halved_calls += self._halved
        return (args, kwargs) if self._halved else None

    def _post_hook(self, module, args, kwargs, output):
        full = self._call == "full"  # a probe call that replayed the deep part counts as cached
        self.stats.full_calls += full
        self.stats.cached_calls += not full
        self.stats.run_calls[0] += 1
        self.stats.run_calls[1] += full
        if self._slot == 0:
            rec = self.stats.trace[-1]
            rec["full"] = full
            if self._step_full is None:
                self._step_full = full
            if not math.isnan(self._signal):
                rec["signal"] = round(self._signal, 5)
                self._signal = float("nan")
            self.stats.full_steps += full
            self.stats.cached_steps += not full
            self._since_full = 0 if full else self._since_full + 1
        if not self._halved:
            return None
        if isinstance(output, tuple):  # both halves of the guidance pair get the one prediction
            return (torch.cat([output[0], output[0]]), *output[1:])
        return type(output)(sample=torch.cat([output.sample, output.sample]))

    def _wrap(self, module: nn.Module, fn) -> None:
        self._originals.append((module, module.__dict__.get("forward")))
        module.forward = fn

    def _unit_forward(self, module: nn.Module):
        original = module.forward
        key = id(module)

        def forward(*args, **kwargs):
            store = self._slots[self._slot]
            if self._call == "cached" and key in self._replayed and key in store:
                # only the entry feature reaches a fresh unit: it alone is forecast (.forecast)
                return self._fc_predict(store, key) if key == self._entry else store[key]
            out = original(*args, **kwargs)
            if self._call == "full" and (key in self._replayed or key == self._entry):
                if key == self._entry and self.mode == "off" and self._slot == 0 and key in store:
                    self._record_drift(store[key], out)  # measuring for StepProfile only: a host sync
                if key == self._entry and self.mode != "off":
                    self._fc_push(store, key, out)
                elif self.mode != "off" or key == self._entry:
                    store[key] = out
            if key == self._probe and self.mode == "adaptive":
                if self._call == "probe":
                    self._decide_at_probe(out)
                else:  # full steps still give the next step its reference
                    self._probe_prev[self._slot] = out[0] if isinstance(out, tuple) else out
            return out

        return forward

    def _record_drift(self, before, after) -> None:
        if isinstance(before, tuple):
            before, after = before[0], after[0]
        if before.shape == after.shape and self._step > 0:
            d = float((after.float() - before.float()).norm() / after.float().norm().clamp_min(1e-12))
            self.stats.trace[-1]["drift"] = round(d, 6)

    def _decide_at_probe(self, out) -> None:
        cur = out[0] if isinstance(out, tuple) else out
        prev = self._probe_prev[self._slot]
        self._probe_prev[self._slot] = cur
        if prev is None or prev.shape != cur.shape:
            self._call = "full"
            return
        if self._slot == 0 and not self._accum_step:
            change = float((cur - prev).abs().mean() / prev.abs().mean().clamp_min(1e-12))
            self._accum += change
            self._accum_step = True
            self._signal = change
        if self._accum >= self.threshold:
            self._call = "full"
            self._accum = 0.0
        else:
            self._call = "cached"

    def _gate_forward(self, module: nn.Module):
        original = module.forward
        key = id(module)

        def forward(*args, **kwargs):
            gate = self._gate[self._slot]
            if self._gating and key in gate:
                return gate[key]
            out = original(*args, **kwargs)
            if (
                self.gate_step is not None
                and self.enabled
                and (self._step <= self.gate_step or key not in gate)
            ):
                gate[key] = out
            return out

        return forward

    def _check_units(self) -> None:
        """Refuse a run if a module the policy replays, reads or gates is no longer the U-Net's own: one swapped
        in after installation (an optimize pass replacing ResnetBlock2D, say) has no wrapper, so the cache
        would report cached steps while that module recomputes from replayed inputs."""
        needed = self._replayed | {self._entry} | ({self._probe} if self.mode == "adaptive" else set())
        if self.gate_step is not None:
            needed |= {id(m) for _, m in self._xattn}
        for name, module in self._units:
            if id(module) not in needed:
                continue
            try:
                current = self.unet.get_submodule(name)
            except AttributeError:
                current = None
            if current is not module:
                raise RuntimeError(
                    f"the U-Net's {name} was replaced after the step cache was installed (fastdiff.optimize after "
                    "fastdiff.step_cache?), so the cache no longer wraps it; fastdiff.restore, then optimize, then "
                    "step_cache"
                )

    def _install(self) -> None:
        units = [u for g in self._layout.producers for u in g] + [u for g in self._layout.up_path for u in g]
        if self._layout.mid is not None:
            units.append(self._layout.mid)
        for u in units:
            self._wrap(u.module, self._unit_forward(u.module))
        for _, attn2 in self._xattn:
            self._wrap(attn2, self._gate_forward(attn2))
        self._units = [(u.name, u.module) for u in units] + list(self._xattn)
        pre = self.unet.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        post = self.unet.register_forward_hook(self._post_hook, with_kwargs=True)
        self._hook = (pre, post)
        self.unet.__dict__[HANDLE_ATTR] = self

    def remove(self) -> None:
        """Remove every wrapper and hook and drop cached tensors (what ``fastdiff.restore`` calls)."""
        for module, previous in reversed(self._originals):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        self._originals = []
        if self._hook is not None:
            for h in self._hook:
                h.remove()
            self._hook = None
        self.unet.__dict__.pop(HANDLE_ATTR, None)
        self._clear_run()
