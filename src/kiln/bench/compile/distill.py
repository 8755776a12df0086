"""A distillation loss, the seed article's example of a loss worth compiling (seed 001).

The loss is Hinton et al.'s knowledge distillation ("Distilling the Knowledge in a Neural
Network", 2015): KL divergence between the frozen teacher's and the student's temperature-
softened distributions, scaled by T^2 so its gradients keep their size as T changes, mixed with
the ordinary cross-entropy on the labels. The teacher's forward pass makes it expensive, which is
the point: where it is compiled (not at all, as its own graph, or in the model's graph) matters.

`loss_builder` gives `build_train_step` the forward+loss function for a bench row's loss and
scope, so the row runs through the same step assembly as `kiln train`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kiln.compile import compile_function
from kiln.config.schema import CompileConfig, ModelConfig
from kiln.models import build_model
from kiln.train.losses import logits_of

# Keys of model factories that set the number of repeated blocks (kiln mlp/vit, HF configs).
_DEPTH_KEYS = ("num_layers", "depth", "num_hidden_layers", "n_layer")


class DistillationLoss(nn.Module):
    """`alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, targets)`."""

    def __init__(self, teacher: nn.Module, temperature: float = 2.0, alpha: float = 0.5):
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        self.temperature = temperature
        self.alpha = alpha

    def forward(self, inputs: Tensor, student_output, targets: Tensor) -> Tensor:
        with torch.no_grad():
            teacher_logits = logits_of(self.teacher(inputs))
        student = logits_of(student_output)
        # Sequence models: every position is a sample.
        student, teacher_logits, targets = student.flatten(0, -2), teacher_logits.flatten(0, -2), targets.flatten()
        t = self.temperature
        kl = F.kl_div(
            F.log_softmax(student / t, dim=-1),
            F.log_softmax(teacher_logits / t, dim=-1),
            reduction="batchmean",
            log_target=True,
        )
        return self.alpha * (t * t) * kl + (1.0 - self.alpha) * F.cross_entropy(student, targets)


class TaskLoss(nn.Module):
    """The model's task loss with the distillation loss's signature, to compile it on its own."""

    def __init__(self, task: str):
        super().__init__()
        if task not in ("classification", "causal_lm"):
            raise ValueError(f"task {task!r}: the model computes its own loss; there is no loss to compile apart")
        self.task = task

    def forward(self, inputs: Tensor, output, targets: Tensor) -> Tensor:
        logits = logits_of(output)
        if self.task == "causal_lm":
            return F.cross_entropy(logits.flatten(0, -2), targets.flatten())
        return F.cross_entropy(logits, targets)


def teacher_config(model: ModelConfig) -> ModelConfig:
    """The student's architecture, twice as deep where the factory takes a depth (the seed's
    teacher: 24 ViT blocks for a 12-block student)."""
    cfg = copy.deepcopy(model)
    for key in _DEPTH_KEYS:
        value = cfg.kwargs.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            cfg.kwargs[key] = 2 * value
    return cfg


def build_teacher(model: ModelConfig, device: torch.device, seed: int) -> nn.Module:
    """A frozen teacher with its own weights; the global RNG is left where it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        built = build_model(teacher_config(model))
    return built.module.to(device).eval().requires_grad_(False)


def loss_builder(
    loss: str,
    scope: str | None,
    task: str,
    teacher: nn.Module | None,
    compile_cfg: CompileConfig,
) -> Callable[[nn.Module], Callable[[Tensor, Tensor], Tensor]] | None:
    """`model -> forward_loss(inputs, targets)` for a row, or None for the task's own loss.

    Scope `model/loss` compiles the loss (teacher included) as a graph of its own; `model+loss`
    and `step` get the whole function compiled by TrainStep; `model` leaves the loss eager.
    """
    if loss == "task" and scope != "model/loss":
        return None
    if loss == "distill":
        if task not in ("classification", "causal_lm"):
            raise ValueError(f"distillation needs logits; model task is {task!r}")
        if teacher is None:
            raise ValueError("distillation needs a teacher")
        head: nn.Module = DistillationLoss(teacher)
    else:
        head = TaskLoss(task)
    loss_fn: Callable = compile_function(head, compile_cfg) if scope == "model/loss" else head

    def build(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
        return lambda inputs, targets: loss_fn(inputs, model(inputs), targets)

    return build
