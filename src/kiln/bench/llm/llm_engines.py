"""The engines `kiln bench llm` puts side by side, behind one small interface.

- `hf-eager`: transformers `generate` with its default dynamic cache, uncompiled;
- `hf-compiled`: `generate(..., cache_implementation="static")`, which in transformers 5.x
  compiles the decode forward by itself (`torch.compile(mode="reduce-overhead")`, CUDA only;
  `GenerationMixin._valid_auto_compile_criteria` / `get_compiled_call` in transformers' source),
  prefill staying eager;
- `kiln-eager`: kiln's engine, no compile, no CUDA graphs;
- `kiln-compiled`: kiln's engine, prefill compiled per padded length, decode compiled and
  replayed as a CUDA graph;
- `kiln-blocks`: the same with each repeated block compiled once for all layers instead of the
  whole step (kiln.llm.block_compile): its warm-up against kiln-compiled's, and what it costs.
Both HF engines share one HF model and the kiln engines one kiln model (each engine keeps its
own cache), so weights are built once per library. Every engine exposes `prefill()` (one prompt
forward that fills the cache, timed by the bench) and `generate(clock)` (the full request, with
a clock mark after the prefill and after every decode step).
"""

from __future__ import annotations

import sys
from typing import Any, get_args

import torch
from torch import Tensor

from kiln.bench.llm.llm_request import Engine as EngineName
from kiln.bench.llm.llm_request import PrefillMode, Tuning
from kiln.llm.engine import Engine, default_inductor_options
from kiln.profile.decode import profile_decode
from kiln.profile.prefill import profile_prefill
from kiln.timing import StepClock

ENGINES: tuple[str, ...] = get_args(EngineName)
DEFAULT_ENGINES = ("hf-eager", "hf-compiled", "kiln-eager", "kiln-compiled")
"""What runs without `--engines`: `kiln-blocks` is asked for (a warm-up comparison, one more compile)."""
HF_ENGINES = ("hf-eager", "hf-compiled")


PREFILL_MODES: tuple[str, ...] = get_args(PrefillMode)
TUNING: tuple[str, ...] = get_args(Tuning)


def kiln_inductor_options(device: torch.device, extra: dict[str, Any] | None, tuning: str) -> tuple[dict, dict]:
    """(decode, prefill) inductor options of kiln-compiled: kiln's defaults, the user's `--inductor`
    options over them, and `tuning` deciding where coordinate-descent tuning runs (`decode`: not in
    prefill, whose matmuls are cuBLAS anyway; `off`: nowhere, which also keeps inductor from lowering
    M=1 matmuls to reductions, so decode gets slower)."""
    options = {**default_inductor_options(device), **(extra or {})}
    untuned = {**options, "coordinate_descent_tuning": False}
    if tuning == "off":
        return untuned, untuned
    return options, (untuned if tuning == "decode" else options)


class KilnEngine:
    def __init__(self, name: str, model, prompts: list[list[int]], new_tokens: int,
                 inductor_options: dict[str, Any] | None = None, *, prefill: str = "compiled", tuning: str = "full",
                 decode_attention: str = "auto", decode_matvec: str = "auto"):
        self.name = name
        compiled = name in ("kiln-compiled", "kiln-blocks")
        decode_options, prefill_options = kiln_inductor_options(model.embed.weight.device, inductor_options, tuning)
        self.engine = Engine(model, compile=compiled, inductor_options=decode_options,
                             compile_prefill=compiled and prefill == "compiled", prefill_inductor_options=prefill_options,
                             decode_attention=decode_attention, decode_matvec=decode_matvec,
                             compile_scope="blocks" if name == "kiln-blocks" else "step")
        self.prompts, self.new_tokens = prompts, new_tokens
        notes = []
        if compiled and self.engine.device.type != "cuda":
            notes.append("no CUDA device: compiled with inductor, decode not captured in a CUDA graph")
        if compiled and prefill == "eager":
            notes.append("prefill eager (--prefill eager)")
        if compiled and tuning != "full":
            notes.append(f"coordinate-descent tuning: {'decode only' if tuning == 'decode' else 'off'} (--tuning {tuning})")
        self.note = "; ".join(notes) or None

    def _prepare(self):
        return self.engine.prepare(self.prompts, max_new_tokens=self.new_tokens)

    def prefill(self) -> None:
        self.engine.run_prefill(self._prepare())

    def generate(self, clock: StepClock) -> list[list[int]]:
        return self.engine.generate(self.prompts, max_new_tokens=self.new_tokens, clock=clock).tokens

    def profile_decode(self, steps: int, out_dir, *, step_bytes: int, copy_bytes_per_s: float | None,
                       title: str) -> dict[str, Any]:
        """A profiled window of decode steps on this engine's request shape (kiln.profile.decode)."""
        return profile_decode(self.engine, self.prompts, new_tokens=self.new_tokens, steps=steps, out_dir=out_dir,
                              step_bytes=step_bytes, copy_bytes_per_s=copy_bytes_per_s, title=title)

    def profile_prefill(self, calls: int, out_dir, *, flops_per_call: int | None, matmul_flops_per_s: float | None,
                        title: str) -> dict[str, Any]:
        """A profiled window of prefills on this engine's request shape (kiln.profile.prefill)."""
        return profile_prefill(self.engine, self.prompts, new_tokens=self.new_tokens, calls=calls, out_dir=out_dir,
                               flops_per_call=flops_per_call, matmul_flops_per_s=matmul_flops_per_s, title=title)

    def compile_stats(self) -> dict[str, Any]:
        stats = {"compiles": len(self.engine.compiled) if self.engine.compile else 0,
                 "decode_attention": self.engine.decode_kernel, "decode_matvec": self.engine.decode_matvec,
                 "compiled_variants": dict(self.engine.compiled), "kv_cache_bytes": self.engine.cache_bytes,
                 "graph_cache": dict(self.engine.graph_cache)}
        if self.engine.decode_matvec == "triton":  # the one-row kernel's autotuned settings, so far in this process
            from kiln.kernels.triton_matvec import tuned_settings

            stats["matvec_settings"] = tuned_settings()
        int4 = sys.modules.get("kiln.kernels.triton_int4")  # the one-row int4 kernel's, on rows whose model runs it
        if int4 is not None and _has_int4_kernel_layers(self.engine.model) and (chosen := int4.tuned_settings()):
            stats["int4_settings"] = chosen
        return stats


def _has_int4_kernel_layers(model: torch.nn.Module) -> bool:
    """Whether `model` has layers multiplied by kiln's one-row int4 kernel (int4@triton's and
    int4@gemlite's layers, whose modules are imported only where such a model was built)."""
    types = tuple(t for t in (getattr(sys.modules.get("kiln.llm.int4_layout"), "Int4TritonLinear", None),
                              getattr(sys.modules.get("kiln.llm.int4_gemlite"), "Int4GemliteLinear", None)) if t)
    return bool(types) and any(isinstance(m, types) for m in model.modules())


class HfEngine:
    def __init__(self, name: str, model, prompts: list[list[int]], new_tokens: int):
        self.name, self.model, self.new_tokens = name, model, new_tokens
        device = next(model.parameters()).device
        self.input_ids = torch.tensor(prompts, dtype=torch.long, device=device)
        self.static = name == "hf-compiled"
        self.note = None
        if self.static and device.type != "cuda":
            self.note = "transformers auto-compiles only on CUDA: static cache, uncompiled, on this device"
        self._static_cache = None

    def _generation_config(self):
        from transformers import GenerationConfig

        # Exactly new_tokens tokens (no EOS stop), greedy, like kiln's rows.
        return GenerationConfig(max_new_tokens=self.new_tokens, min_new_tokens=0, do_sample=False,
                                eos_token_id=None, pad_token_id=0,
                                cache_implementation="static" if self.static else None)

    @torch.no_grad()
    def prefill(self) -> None:
        """The eager prompt forward both HF recipes run inside generate (HF compiles decode only)."""
        kwargs: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1}
        if self.static:
            if self._static_cache is None:
                from transformers import StaticCache

                self._static_cache = StaticCache(config=self.model.config,
                                                 max_cache_len=self.input_ids.shape[1] + self.new_tokens)
            self._static_cache.reset()
            kwargs["past_key_values"] = self._static_cache
        self.model(self.input_ids, **kwargs)

    def generate(self, clock: StepClock) -> list[list[int]]:  # as users call it (generate sets no_grad)
        from transformers import LogitsProcessor, LogitsProcessorList

        class ClockMark(LogitsProcessor):
            """A no-op logits processor marking the clock each time generate has new logits."""

            def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
                clock.mark()
                return scores

        clock.start()
        out = self.model.generate(self.input_ids, attention_mask=torch.ones_like(self.input_ids),
                                  generation_config=self._generation_config(),
                                  logits_processor=LogitsProcessorList([ClockMark()]))
        new = out[:, self.input_ids.shape[1]:]
        if new.shape[1] != self.new_tokens:
            raise RuntimeError(f"transformers generated {new.shape[1]} tokens, asked for {self.new_tokens}")
        return new.tolist()

    def compile_stats(self) -> dict[str, Any]:
        compiled = getattr(self.model, "_compiled_call", None) is not None  # GenerationMixin.get_compiled_call
        if self.static and self.note is None and not compiled:
            self.note = "transformers did not compile decode (no _compiled_call after generate)"
        return {"compiles": int(compiled), "compiled_variants": None, "kv_cache_bytes": None, "graph_cache": None}
