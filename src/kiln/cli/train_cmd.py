"""`kiln train [--config FILE.toml] [--run-dir DIR] [--nproc-per-node N ...] [KEY=VALUE ...]`."""

from __future__ import annotations

import argparse

from kiln.cli.args import add_verbose_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a model (default: the seed MLP on synthetic data, short run)",
        description="Train a model. Overrides use dotted config keys, e.g. training.steps=50 compile.enabled=true",
    )
    p.add_argument("--config", help="TOML config file (see configs/); defaults apply to missing keys")
    p.add_argument("--run-dir", help="output directory (default: runs/<time>-<model>); the same command again continues "
                   "a run that crashed there (checkpoint.resume=auto)")
    add_verbose_flag(p)
    d = p.add_argument_group("distributed (runs torchrun for you; `torchrun -m kiln train ...` works too)")
    d.add_argument("--nproc-per-node", type=int, help="processes on this node (one per GPU; gloo ranks on CPU)")
    d.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    d.add_argument("--node-rank", type=int, help="this node's rank (0 on the rendezvous host)")
    d.add_argument("--rdzv-endpoint", help="HOST:PORT of node rank 0, for several nodes")
    d.add_argument("--max-restarts", type=int, default=0, help="restart the group up to K times after a failure")
    d.add_argument("--rdzv-wait", type=float, default=30.0, help="seconds a non-zero node waits for the endpoint")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides, anywhere on the command line; applied after --config, later ones win")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.config import load_config

    cfg = load_config(args.config, args.overrides)  # ConfigError -> exit 2 before torch is imported

    from kiln.distributed.launch import LaunchSpec
    from kiln.train.command import TrainRequest, run_train

    launch = None
    if args.nproc_per_node is not None or args.nnodes > 1:
        launch = LaunchSpec(nproc_per_node=args.nproc_per_node if args.nproc_per_node is not None else 1,
                            nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                            max_restarts=args.max_restarts, rdzv_wait_s=args.rdzv_wait)

    def on_run_dir(run_dir) -> None:  # a failure's error.log and dependencies.log (kiln.noise) go there
        args.output_dir = run_dir

    outcome = run_train(cfg, TrainRequest(config=args.config, overrides=tuple(args.overrides), run_dir=args.run_dir,
                                          verbose=args.verbose, launch=launch, on_run_dir=on_run_dir))
    for line in outcome.lines:
        print(line)
    return outcome.code
