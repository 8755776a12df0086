"""The one table of peers (kiln.bench.peers.interface): each bench runs the peers registered for it.
A new peer is one folder under kiln/bench/peers/ and one entry here (docs/extension.md "Add a benchmark peer")."""

from __future__ import annotations

from typing import Any

from kiln.bench.peers.gpt_fast.peer import GPT_FAST
from kiln.bench.peers.interface import Bench, Peer
from kiln.bench.peers.plain.peer import PLAIN
from kiln.bench.peers.torchtitan.peer import TORCHTITAN

PEERS: dict[tuple[Bench, str], Peer[Any, Any, Any, Any]] = {(p.bench, p.name): p for p in (GPT_FAST, PLAIN, TORCHTITAN)}
"""(bench, name) -> the peer (a kiln.bench.peers.interface.Peer; of `llm`, an LlmPeer), in the order its
rows run."""


def peers_for(bench: Bench) -> list[Peer[Any, Any, Any, Any]]:
    """The peers registered for `bench`, in the table's order."""
    return [peer for (b, _), peer in PEERS.items() if b == bench]


def check_peers(bench: Bench, request: Any) -> None:
    """Every peer of `bench` checks its own options in `request` (ConfigError naming the flag), before
    any work; for `kiln bench train-llm`, the TrainLlmOptions."""
    for each in peers_for(bench):
        each.check(request)


def peer_names(bench: Bench) -> tuple[str, ...]:
    return tuple(peer.name for peer in peers_for(bench))


def peer(bench: Bench, name: str) -> Peer[Any, Any, Any, Any]:
    """The peer `name` of `bench`; KeyError when none is registered."""
    return PEERS[(bench, name)]
