"""Predicted data-parallel step time and efficiency at world sizes that were not measured.

The model (every input is a measurement or a flag; nothing is fitted to the points it predicts):

1. Compute. T1 is the strategy's own step at ONE rank with the same per-rank batch (measured by
   `kiln bench scale`: the wrapper's hooks, bucket copies and graph splits included, communication
   excluded). It is split into forward, backward and the rest (clip + optimizer + host work):
   `backward_share` (default 0.6) and `rest_share` (0.1); forward:backward = 1:2 is the FLOP ratio
   of dense layers. Each bucket's / unit's share of forward and backward compute is its share of
   the parameters.
2. One collective (alpha-beta, as NCCL's own tuner models it), n ranks on m = ceil(n/g) nodes of g:
       ring:  hops * latency + bytes * f / busbw,   f = 2(n-1)/n all-reduce, (n-1)/n AG / RS,
              hops = (n-1) per pass (all-reduce: two passes); a pass crosses m inter-node links;
       tree (all-reduce across nodes only): 2(log2(m) * inter_latency + (g-1) * intra_latency)
              + the same bandwidth term; NCCL takes the faster, so does the model.
   busbw is the measured intra-node bus bandwidth of that collective; across nodes the ring is
   limited to min(intra busbw, g * inter_bw): NCCL runs one ring per NIC, so a node boundary
   carries g rings, each at one GPU's network bandwidth `inter_bw`. Per-hop latency is the
   measured latency divided by the measured ring's hops (or `--intra-latency-us`).
3. Schedule. One communication stream, FIFO in issue order, beside the compute stream:
   DDP: bucket j is all-reduced once backward has produced its gradients (bucket j ready after
   the buckets before it, in proportion to parameters); the optimizer waits for the last one.
   FSDP2: the all-gather of unit u is issued when unit u-1 starts computing (FSDP2's prefetch,
   one unit ahead), forward and backward; unit u computes once its all-gather is done; its
   reduce-scatter is issued when its backward ends; the root's gradients go last.
   Exposed communication = simulated step - T1.
4. Overlap cost. Communication that runs beside compute is not free: NCCL kernels take SMs and
   memory bandwidth. `overlap_cost` (measured by kiln.bench.scale.comm's overlap probe, or given) is
   the share of the overlapped time that still lengthens the step.

Predicted step = T1 + exposed + overlap_cost * overlapped. Weak scaling (fixed per-rank batch):
efficiency = T_base / step, T_base the one-process step without any wrapper (the same baseline
the measured rows use). Strong scaling: T1 at batch B/n is taken as T1(B)/n (optimistic for
small per-rank batches, where kernels stop filling the device).
Not modelled: stragglers and host jitter (a synchronous step waits for the slowest rank), a
step that is host-bound (then hidden communication is hidden behind the host, not the device),
the sharded optimizer's saving under FSDP2, PAT/NVLS/SHARP algorithms, network congestion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kiln.distributed.traffic import Collective, StepTraffic

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def bus_factor(op: str, world: int) -> float:
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def ring_hops(op: str, world: int) -> int:
    return (2 if op == "all_reduce" else 1) * (world - 1)


@dataclass(frozen=True)
class LinkCost:
    """One collective's intra-node cost: per-hop latency (s) and bus bandwidth (bytes/s)."""

    hop_latency_s: float
    busbw: float
    source: str
    """`measured (n ranks)` or `given`."""


@dataclass(frozen=True)
class Topology:
    gpus_per_node: int
    intra: dict[str, LinkCost]
    inter_bw: float
    """Network bandwidth one GPU can use (bytes/s): one NIC per GPU, as on DGX-class nodes."""
    inter_latency_s: float
    """Latency of one inter-node hop (s)."""


def collective_time(op: str, nbytes: int, world: int, topo: Topology) -> tuple[float, str]:
    """(seconds, algorithm) of one collective of `nbytes` (nccl-tests size) on `world` ranks."""
    if world <= 1:
        return 0.0, "none"
    link = topo.intra[op]
    g = min(topo.gpus_per_node, world)
    nodes = math.ceil(world / g)
    passes = 2 if op == "all_reduce" else 1
    if nodes == 1:
        bw, hop = link.busbw, (world - 1) * link.hop_latency_s
    else:
        bw = min(link.busbw, g * topo.inter_bw)
        hop = (world - nodes) * link.hop_latency_s + nodes * topo.inter_latency_s
    transfer = nbytes * bus_factor(op, world) / bw
    ring = passes * hop + transfer
    if op == "all_reduce" and nodes > 1:
        tree = 2 * (math.ceil(math.log2(nodes)) * topo.inter_latency_s + (g - 1) * link.hop_latency_s) + transfer
        if tree < ring:
            return tree, "tree"
    return ring, "ring"


@dataclass
class StepPrediction:
    step_s: float
    compute_s: float
    comm_s: float
    exposed_s: float
    overlapped_s: float
    contention_s: float
    algorithms: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Phases:
    backward_share: float = 0.6
    rest_share: float = 0.1

    def split(self, t1: float) -> tuple[float, float, float]:
        return t1 * (1 - self.backward_share - self.rest_share), t1 * self.backward_share, t1 * self.rest_share


class _Stream:
    """A FIFO communication stream: an op starts when issued and when the previous one is done."""

    def __init__(self) -> None:
        self.free = 0.0
        self.busy: list[tuple[float, float]] = []

    def run(self, issue: float, seconds: float) -> float:
        start = max(issue, self.free)
        self.free = start + seconds
        if seconds > 0:
            self.busy.append((start, self.free))
        return self.free

    def overlap_with(self, spans: list[tuple[float, float]]) -> float:
        return sum(max(0.0, min(b, d) - max(a, c)) for a, b in self.busy for c, d in spans)


def _cost(c: Collective, world: int, topo: Topology, algos: dict[str, str]) -> float:
    seconds, algo = collective_time(c.op, c.nbytes, world, topo)
    algos[c.op] = algo
    return seconds


def _simulate_ddp(traffic: StepTraffic, world: int, topo: Topology, fwd: float, bwd: float, algos) -> tuple:
    stream = _Stream()
    ready = fwd
    for c in traffic.collectives:
        ready += bwd * c.share
        stream.run(ready, _cost(c, world, topo, algos))
    end = max(fwd + bwd, stream.free)
    return end, stream, [(fwd, fwd + bwd)]


def _simulate_fsdp(traffic: StepTraffic, world: int, topo: Topology, fwd: float, bwd: float, algos) -> tuple:
    stream = _Stream()
    spans: list[tuple[float, float]] = []
    t = prev_start = 0.0
    for c in (c for c in traffic.collectives if c.phase == "forward"):  # root, then units in order
        done = stream.run(prev_start, _cost(c, world, topo, algos))  # issued as the unit before starts
        start = max(t, done)
        t = start + fwd * c.share
        spans.append((start, t))
        prev_start = start
    backward = [c for c in traffic.collectives if c.phase == "backward"]
    gathers = {c.label: c for c in backward if c.op == "all_gather"}
    scatters = [c for c in backward if c.op == "reduce_scatter"]  # one per unit, in backward order
    ready: dict[str, float] = {}
    if scatters and scatters[0].label in gathers:
        ready[scatters[0].label] = stream.run(t, _cost(gathers[scatters[0].label], world, topo, algos))
    for k, c in enumerate(scatters):
        start = max(t, ready.get(c.label, 0.0))
        if k + 1 < len(scatters) and scatters[k + 1].label in gathers:  # prefetch the next unit's gather
            nxt = scatters[k + 1].label
            ready[nxt] = stream.run(start, _cost(gathers[nxt], world, topo, algos))
        t = start + bwd * c.share
        spans.append((start, t))
        stream.run(t, _cost(c, world, topo, algos))
    return max(t, stream.free), stream, spans


def predict_step(traffic: StepTraffic, t1: float, world: int, topo: Topology, *, overlap_cost: float,
                 phases: Phases = Phases()) -> StepPrediction:
    """Step time of `traffic`'s strategy on `world` ranks, from its 1-rank step `t1` (seconds)."""
    fwd, bwd, rest = phases.split(t1)
    algos: dict[str, str] = {}
    simulate = _simulate_ddp if traffic.strategy == "ddp" else _simulate_fsdp
    end, stream, spans = simulate(traffic, world, topo, fwd, bwd, algos)
    exposed = max(0.0, end - (fwd + bwd))
    comm = sum(b - a for a, b in stream.busy)
    overlapped = stream.overlap_with(spans)
    contention = overlap_cost * overlapped
    return StepPrediction(step_s=t1 + exposed + contention, compute_s=t1, comm_s=comm, exposed_s=exposed,
                          overlapped_s=overlapped, contention_s=contention, algorithms=algos)


def calibrate_t1(traffic: StepTraffic, step_s: float, world: int, topo: Topology, *, overlap_cost: float,
                 phases: Phases = Phases()) -> float | None:
    """The 1-rank step T1 for which the model reproduces a measured `step_s` at `world` (fixed point:
    the overlap windows scale with T1). Used when a strategy's 1-rank step was not measured. None when
    no T1 >= 0 can: the model's communication alone already takes longer than the measured step."""
    floor = predict_step(traffic, 0.0, world, topo, overlap_cost=overlap_cost, phases=phases).step_s
    if floor > step_s:
        return None
    t1 = step_s
    for _ in range(50):
        predicted = predict_step(traffic, t1, world, topo, overlap_cost=overlap_cost, phases=phases).step_s
        t1 = max(0.0, t1 + (step_s - predicted))
        if abs(step_s - predicted) < 1e-9:
            break
    return t1
