"""What `kiln explain` and `kiln doctor` are asked to do: one field per flag (kiln.config.options),
unchecked; kiln.diagnose.diagnose_command checks and runs them. Imports no torch: the CLI builds
its parsers from these."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.options import option

TARGET_HELP = ("registry name (mlp, vit, hf:llama-tiny), package.module:function or path/to/file.py:function; "
               "the function returns an nn.Module or (module, example_inputs), inputs being any Python values")


@dataclass(kw_only=True)
class TargetOptions:
    """The TARGET and its inputs, the flags both commands take."""

    target: str = option(shape="arg", metavar="TARGET", help=TARGET_HELP)
    inputs: list[str] = option(
        default_factory=list, name="--input", shape="repeat", metavar="SPEC",
        help="one per forward argument: 8x3x224x224, float16:4x16, int64[0,512):2x32, float=0.5")
    inputs_from: str | None = option(
        None, metavar="FILE",
        help=".pt with a tensor, a tuple of inputs, or a list of input tuples (one per call), .npy, or "
             "file.py:function returning the same as Python values (strings, dicts, dataclasses)")
    kwarg: list[str] = option(default_factory=list, shape="repeat", metavar="KEY=VALUE",
                              help="keyword argument for the model factory (value parsed as JSON, else a string)")
    train: bool | None = option(
        None, shape="yes_no",
        help="run forward and backward (loss = sum of the outputs); --no-train: forward only, autograd off "
             "(explain's default: as the module's own mode says; doctor's: forward only)")
    device: str = option("cpu", help="device to run on (default cpu)")
    json: str | None = option(None, metavar="FILE",
                              help="write the report as JSON to FILE ('-' for stdout, no table)")


@dataclass(kw_only=True)
class ExplainRequest(TargetOptions):
    """`kiln explain`'s request, one field per flag."""

    vary: list[str] = option(
        default_factory=list, shape="repeat", metavar="KIND",
        help="input changes to provoke recompiles: batch[=4,8], dimN[=16,32], scalars, dtype, autocast "
             "(default: batch,scalars; none with several --inputs-from sets)")
    no_vary: bool = option(False, shape="switch", help="call with the example inputs only")
    backend: str | None = option(
        None, help="backend behind the recorder (default eager; aot_eager with --train, to see backward graphs)")
    no_verify: bool = option(
        False, shape="switch",
        help="do not re-run the check with each mechanical fix (config flag, mark_dynamic) applied")
    fullgraph_check: bool = option(
        False, shape="switch",
        help="show only whether torch.compile(fullgraph=True) works, naming the first blocker, and exit 1 "
             "when it does not (the full report gives the same verdict)")


@dataclass(kw_only=True)
class DoctorRequest(TargetOptions):
    """`kiln doctor`'s request, one field per flag."""

    mode: str | None = option(None, help="also run inductor with this torch.compile mode (e.g. max-autotune)")
    stages: str | None = option(
        None, help="comma-separated stages instead of eager,aot_eager,aot_eager_decomp_partition,inductor")
    backend: list[str] = option(
        default_factory=list, shape="repeat", metavar="NAME",
        help="an extra stage: a registered backend name or module:function (repeatable)")
    tol: float | None = option(None, help="harness tolerance (default 1e-4; 1e-3 with --train)")
    no_bisect: bool = option(False, shape="switch",
                             help="do not run torch's CompilerBisector on inductor failures")
    no_repro: bool = option(False, shape="switch", help="do not write a repro script")
    out: str | None = option(
        None, help="directory for the repro script (default: runs/<time>-doctor-<target>, created only when a "
        "stage fails and a repro is written)")
