"""The peer interface: what kiln asks of another project's engine or trainer (or of a baseline
such as the hand-written loop) to run it as rows beside kiln's own in a `kiln bench` command.

A peer is four steps, called by its bench in this order:
- `check(request)`: from the options alone, before any work; a bad flag or path is a ConfigError
  naming it (exit 2). A peer the request does not ask for checks nothing.
- `prepare(ctx)`: what must exist before it runs (a converted checkpoint, a job file), done before
  kiln's rows are timed where it is heavy; the result's `close()` removes what it wrote (None:
  nothing was prepared, as gpt-fast's without --gpt-fast).
- `run(prepared, ctx)`: its rows, each with a `status` (a peer that fails keeps the error and the
  bench goes on).
- `rows(found, ctx)`: its rows as the bench reports them: figures that set them against kiln's.
Rows are dataclasses (kiln.bench.typed_row.JsonRow) whose `to_json()` is the row of results.json.
A peer of `kiln bench llm` also says whether the plan asks for it (`LlmPeer.asked`).
`ctx` is the bench's typed context (kiln.bench.llm.llm_peer_context for `kiln bench llm`,
kiln.bench.train_llm.llm_train_result for `kiln bench train-llm`); registry.py lists every peer.
"""

from __future__ import annotations

from typing import Literal, Protocol, TypeVar

from kiln.bench.typed_row import JsonRow

Bench = Literal["llm", "train-llm"]
"""The benches that run peers: `kiln bench llm` (generation) and `kiln bench train-llm` (training)."""

RequestT = TypeVar("RequestT", contravariant=True)
CtxT = TypeVar("CtxT", contravariant=True)
PrepT = TypeVar("PrepT")
RowT = TypeVar("RowT", bound=JsonRow)


class Prepared(Protocol):
    def close(self) -> None:
        """Remove what `prepare` wrote (checkpoints the size of the model)."""


class NothingPrepared:
    """`prepare`'s result for a peer that needs nothing before it runs."""

    def close(self) -> None:
        return None


class PeerDefaults:
    """The steps a simple peer leaves as they are: no check of its own, nothing to prepare, its rows
    as `run` gives them, no settings per row (a subclass writes `run` and what else it needs)."""

    row_settings: str | None = None

    def check(self, request: object) -> None:
        return None

    def prepare(self, ctx: object) -> NothingPrepared:
        return NothingPrepared()

    def rows(self, found: list[RowT], ctx: object) -> list[RowT]:
        return found


class Peer(Protocol[RequestT, CtxT, PrepT, RowT]):
    """One peer of one bench (see the module docstring for the four steps)."""

    name: str
    """Its name in the bench's rows and flags (`gpt-fast`, `torchtitan`, `plain`)."""
    bench: Bench
    row_settings: str | None
    """What a row of this peer may set for itself (`kiln bench train-llm --peer-recipe`: its
    RowSpec.overrides, which `check` validates and `run` applies), or None: it takes none."""

    def check(self, request: RequestT) -> None: ...

    def prepare(self, ctx: CtxT) -> PrepT: ...

    def run(self, prepared: PrepT, ctx: CtxT) -> list[RowT]: ...

    def rows(self, found: list[RowT], ctx: CtxT) -> list[RowT]: ...


class LlmPeer(Peer[RequestT, CtxT, PrepT, RowT], Protocol[RequestT, CtxT, PrepT, RowT]):
    """A peer of `kiln bench llm`: it runs kiln's decoder's weights, so the bench builds that decoder
    whenever a peer is asked for, even with no kiln engine among the rows."""

    def asked(self, plan: object) -> bool:
        """Whether the checked plan asks for this peer's rows (its flag was given)."""
        ...
