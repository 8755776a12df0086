"""What `kiln bench train-llm` is asked to do: `TrainLlmRequest`, one field per flag
(kiln.config.options), unchecked; kiln.bench.train_llm.llm_train_check checks it. Imports no torch: the CLI
builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from kiln.bench.train_llm.llm_train_recipes import KILN_RECIPES
from kiln.config.options import option

LOSS_TAIL = 10
"""Steps at the end of a row whose mean loss is compared across rows. Each step's loss is one
batch's: two rows of the same arithmetic (FSDP2 with and without resharding after forward, 8B)
differed by several percent at single steps and agreed far closer over the last ten."""

KilnFamily = Literal["llama", "hf"]
Precision = Literal["bf16-mixed", "fp32"]
PlainAc = Literal["none", "full"]


@dataclass
class TrainLlmRequest:
    """`kiln bench train-llm`'s request, one field per flag."""

    model: str = option("llama-3.2-1b", help="a kiln.llm preset (llama-3.2-1b, llama-3.2-3b, llama-3.1-8b) or a "
                        "config.json/model dir")
    seq_len: int = option(2048, help="tokens per sequence (default 2048)")
    batch_size: int = option(4, help="sequences per step on each rank (default 4; the global batch is "
                             "--nproc-per-node x this)")
    nproc_per_node: int = option(1, help="ranks of every row (one per GPU; gloo ranks on CPU): kiln's rows run as "
                                 "`kiln train` under torchrun, the plain loop as an FSDP2 loop, torchtitan through "
                                 "its launcher (default 1: every row but torchtitan in this process)")
    steps: int = option(50, help="optimizer steps each row trains (default 50)")
    warmup: int = option(10, help="first steps left out of the timing (default 10)")
    rows: list[str] | None = option(None, shape="chunks", metavar="LIST",
                                    help=f"comma-separated rows, in order: plain, torchtitan, {', '.join(KILN_RECIPES)} "
                                    "or a --recipe or --peer-recipe name (default: plain, kiln, every --recipe, "
                                    "torchtitan, every --peer-recipe)")
    recipe: list[str] = option(default_factory=list, shape="repeat", metavar="'NAME: KEY=VALUE ...'",
                               help="a kiln row: a name and config overrides on the bench's base config (repeatable)")
    peer_recipe: list[str] = option(default_factory=list, shape="repeat", metavar="'NAME: PEER KEY=VALUE ...'",
                                    help="a peer row with settings of its own: a name, the peer and overrides of its "
                                    "job (repeatable; torchtitan takes SECTION.KEY=VALUE), e.g. "
                                    "'torchtitan-noac: torchtitan activation_checkpoint.mode=none'")
    skip_invalid_recipes: bool = option(False, shape="switch", help="report a recipe kiln's config refuses as a "
                                        "skipped row instead of exiting 2")
    kiln_family: KilnFamily = option("llama", choices=get_args(KilnFamily), help="model family of the kiln rows: "
                                     "llama (kiln's own decoder, default) or hf (transformers)")
    precision: Precision = option("bf16-mixed", choices=get_args(Precision),
                                  help="base policy of every row (a kiln recipe may override it)")
    lr: float = option(1e-4, help="peak learning rate of every row (default 1e-4: early AdamW steps on random weights "
                       "spike at higher rates, and a spike amplifies the bf16 rounding differences between rows)")
    lr_warmup: int | None = option(None, help="linear learning-rate warm-up steps (default: half of --steps)")
    seed: int = option(0, help="seed of the data, the initial weights and every row")
    baseline: str | None = option(None, metavar="ROW",
                                  help="the row the others are compared with (default: plain, else the first row)")
    loss_tol: float = option(0.02, help=f"relative difference of the mean loss of the last {LOSS_TAIL} steps to the "
                             "reference row's called ok (default 0.02)")
    untie: bool = option(False, shape="switch", help="train the untied shape (separate LM head) in every row; implied "
                         "when torchtitan is a row")
    no_plain_compile: bool = option(False, shape="switch", help="run the plain loop eagerly (default: "
                                    "torch.compile(model), as the hand-written loop does; per decoder layer at "
                                    "--nproc-per-node > 1)")
    plain_ac: PlainAc = option("none", choices=get_args(PlainAc), help="activation checkpointing of the plain loop at "
                               "--nproc-per-node > 1: none, or full (transformers' gradient_checkpointing_enable)")
    torchtitan_set: list[str] = option(default_factory=list, shape="repeat", metavar="SECTION.KEY=VALUE",
                                       help="override a key of torchtitan's job (repeatable), e.g. "
                                       "activation_checkpoint.mode=selective")
    torchtitan_timeout_s: float = option(600.0, help="seconds the torchtitan row may take")
    row_timeout_s: float = option(900.0, help="seconds a kiln or plain row may take at --nproc-per-node > 1")
    deadline_s: float | None = option(None, help="start no row after this many seconds (later rows: skipped)")
    device: str = option("auto", help="auto, cpu, cuda, cuda:N")
    data_dir: str | None = option(None, help="where the corpus, tokenizer and initial weights go (default OUT/data)")
    out: str | None = option(None, help="output directory (default: runs/<time>-bench-train-llm-<model>)")
