"""What `kiln bench scale`, `kiln bench comm` and `kiln bench predict` are asked to do: one
dataclass per command, one field per flag (kiln.config.options), unchecked.

The flags the commands share are the fields of the base classes (VariantFlags: the model source
and variants; PredictionFlags: the prediction's topology). kiln.bench.scale.scale_command checks a
request before any process starts. Imports no torch: the CLI builds its parsers from these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kiln.config.options import option

Mode = Literal["weak", "strong"]
PREDICTION = "prediction (kiln.bench.scale.predict; measured values are used where a flag is not given)"
OVERRIDES = "config overrides, after --config"


@dataclass
class VariantFlags:
    """The model (a config file or a model spec), its overrides and the variants to compare."""

    config: str | None = option(None, exclusive="source",
                                help="TOML config of the model/data/optimizer (e.g. configs/vit_b16.toml)")
    model: str | None = option(None, exclusive="source",
                               help="model spec (registry name, timm:<name>, hf:<...>, module:function)")
    strategies: str = option("ddp,fsdp", help="comma-separated: ddp,fsdp (default both)")
    variant: list[str] = option(default_factory=list, shape="repeat", metavar="NAME=STRATEGY[,KEY=VALUE...]",
                                help="an extra variant, e.g. fsdp-zero2=fsdp,distributed.fsdp_reshard_after_forward"
                                "=false (repeatable)")
    overrides: list[str] = option(default_factory=list, shape="words", metavar="KEY=VALUE", help=OVERRIDES)


@dataclass
class PredictionFlags:
    """The cluster a prediction is for; None takes the measured value (or the device's default)."""

    predict_worlds: str = option("16,32,64,128,256,512,1024", group=PREDICTION, help="world sizes to predict")
    gpus_per_node: int | None = option(None, group=PREDICTION,
                                       help="GPUs per node of the predicted cluster (default 8 on CUDA)")
    bus_bw: float | None = option(None, group=PREDICTION,
                                  help="intra-node bus bandwidth, GB/s (default: measured, else given)")
    intra_latency_us: float | None = option(None, group=PREDICTION,
                                            help="latency of one intra-node ring hop, microseconds")
    inter_bw: float | None = option(None, group=PREDICTION,
                                    help="network bandwidth per GPU, GB/s (default 45: 400 Gb/s NICs)")
    inter_latency_us: float | None = option(None, group=PREDICTION,
                                            help="latency of one inter-node hop, microseconds (default 5)")
    overlap_cost: float | None = option(None, group=PREDICTION,
                                        help="share of overlapped communication that still costs time, 0..1")
    backward_share: float = option(0.6, group=PREDICTION, help="share of the 1-rank step spent in backward")
    rest_share: float = option(0.1, group=PREDICTION, help="share after backward (clip, optimizer, host)")
    calibrate_at: int | None = option(None, group=PREDICTION,
                                      help="infer each variant's 1-rank step from its measured point here")


def mode_option() -> Mode:
    return option("weak", shape="pick", help="fixed per-rank batch (default) | fixed global batch")


def thresholds_option(help: str) -> str:
    return option("2:85,4:80,8:75", help=help)


def device_option() -> str | None:
    return option(None, help="same as training.device=... (auto, cpu, cuda)")


@dataclass
class ScaleRequest(PredictionFlags, VariantFlags):
    """`kiln bench scale`'s request."""

    nprocs: str = option("1,2,4,8", help="rank counts, e.g. 1,2,4,8 (default)")
    mode: Mode = mode_option()
    thresholds: str = thresholds_option("WORLD:PERCENT efficiency bars (seed default)")
    steps: int = option(60, help="training steps per point (default 60)")
    timeout: float = option(600.0, help="seconds one point (or the bandwidth step) may take")
    device: str | None = device_option()
    no_comm: bool = option(False, shape="switch", help="skip the collective-bandwidth step")
    comm_repeats: int = option(20, help="timed samples per collective size")
    out: str | None = option(None, help="output directory (default: runs/<time>-bench-scale-<name>)")


@dataclass
class CommRequest(VariantFlags):
    """`kiln bench comm`'s request."""

    nprocs: int | None = option(None, help="ranks (default: visible GPUs, or 2 on CPU)")
    repeats: int = option(20, help="timed samples per size")
    warmup: int = option(5, help="untimed calls per size")
    no_overlap: bool = option(False, shape="switch", help="skip the compute/communication overlap probe")
    device: str | None = device_option()
    out: str | None = option(None, help="output directory (default: runs/<time>-bench-comm-<name>)")


@dataclass
class PredictRequest(PredictionFlags, VariantFlags):
    """`kiln bench predict`'s request."""

    points: str | None = option(None, required=True, help="results.json holding the measured point rows")
    comm: str | None = option(None, help="a `kiln bench comm` results.json (measured latency, bandwidth, overlap)")
    mode: Mode = mode_option()
    thresholds: str = thresholds_option("WORLD:PERCENT efficiency bars")
    device_type: Literal["cuda", "cpu"] = option("cuda", choices=("cuda", "cpu"), help="which given defaults apply")
    out: str | None = option(None, required=True, help="output directory")
