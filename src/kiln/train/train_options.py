"""What `kiln train` is asked to do: one field per flag (kiln.config.options), unchecked; a module
of its own, light to import: the CLI loads the config before torch is imported.
kiln.train.command.train_request turns it into the run's (or the job's) request."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.options import option

DIST = "distributed (runs torchrun for you; `torchrun -m kiln train ...` works too)"


@dataclass
class TrainOptions:
    """`kiln train`'s flags and KEY=VALUE overrides, one field each."""

    config: str | None = option(None, help="TOML config file (see configs/); defaults apply to missing keys")
    run_dir: str | None = option(None, help="output directory (default: runs/<time>-<model>); the same command "
                                 "again continues a run that crashed there (checkpoint.resume=auto)")
    nproc_per_node: int | None = option(None, group=DIST,
                                        help="processes on this node (one per GPU; gloo ranks on CPU)")
    nnodes: int = option(1, group=DIST, help="number of nodes")
    node_rank: int | None = option(None, group=DIST, help="this node's rank (0 on the rendezvous host)")
    rdzv_endpoint: str | None = option(None, group=DIST, help="HOST:PORT of node rank 0, for several nodes")
    max_restarts: int = option(0, group=DIST, help="restart the group up to K times after a failure")
    rdzv_wait: float = option(30.0, group=DIST, help="seconds a non-zero node waits for the endpoint")
    overrides: list[str] = option(default_factory=list, shape="words", metavar="KEY=VALUE",
                                  help="config overrides, anywhere on the command line; applied after --config, "
                                  "later ones win")
