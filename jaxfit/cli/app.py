"""The ``jaxfit`` app: the subcommands' registry, the options they share, and one-line errors.

Every error is one line ``jaxfit: error: ...`` with exit code 2: jaxfit's own
(:class:`jaxfit.errors.JaxfitError`), and tyro's parsing errors, held back while tyro parses and
then folded into one line that names the help to read.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import sys
from typing import TYPE_CHECKING, Annotated, Any, Literal

import tyro
from rich.console import Console

from jaxfit.errors import JaxfitError
from jaxfit.fit.mesh import MIN_SHARD_BYTES, MeshSpec
from jaxfit.fit.options import Size

if TYPE_CHECKING:
    from jaxfit.cli.output import ProgressPrinter
    from jaxfit.fit.sources import ScriptSource

app = tyro.extras.SubcommandApp()

COMMAND: list[str] = []
"""The training command after ``--`` (tyro never sees it): ``jaxfit run -- python train.py ...``."""

SUBCOMMANDS = ("fit", "run", "tune", "plan", "gpus", "examples", "schedule", "calibrate", "version")
WandbMode = Literal["online", "offline", "disabled"]
Flat = tyro.conf.OmitArgPrefixes
"""Options of a nested dataclass take no prefix (``--headroom``, not ``--options.headroom``)."""


@dataclasses.dataclass(frozen=True)
class ScriptArgs:
    """How to find the train step inside a training script.

    Attributes:
      step_name: The name of the jitted train step function (found through functools.partial).
        Default: train_step, or, when the script calls none, the first jitted function that is a
        train step: it takes a batch beside its state and returns that state updated (arrays of
        the same shapes and dtypes); the output says which it took.
      batch_flag: The script's batch-size flag, e.g. --batch-flag=--bs or --batch-flag
        --config.batch_size.
      accum_flag: The script's gradient-accumulation flag (used by --global-batch).
      batch_arg: Which positional argument of the step is the batch (default: found by shape).
      probe_args: An argument added to the command only while probing; repeatable. The probe runs
        the script's start-up, which may create its checkpoint folder (openpi's does): e.g.
        --probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe keeps that out of the real run's way.
    """

    step_name: str | None = None
    batch_flag: str = "--batch-size"
    accum_flag: str = "--grad-accum-steps"
    batch_arg: int | None = None
    probe_args: Annotated[tuple[str, ...], tyro.conf.arg(name="probe-arg"), tyro.conf.UseAppendAction] = ()

    def source(self) -> ScriptSource:
        """The script after ``--``, as a workload source."""
        from jaxfit.fit.sources import script_source

        return script_source(
            COMMAND,
            step_name=self.step_name,
            batch_flag=self.batch_flag,
            batch_arg=self.batch_arg,
            probe_args=list(self.probe_args),
            accum_flag=self.accum_flag,
        )


@dataclasses.dataclass(frozen=True)
class MeshArgs:
    """On how many devices a built-in example or --entry step runs (a script brings its own mesh).

    Attributes:
      devices: Devices of the (batch, fsdp) mesh: the batch is split over all of them, so the
        answer is a multiple of this. At most the GPUs this machine has (jaxfit plan compiles
        for more, on a mocked topology); on a CPU-only machine, host devices.
      fsdp: Devices each parameter and optimizer-state array is sharded over (openpi's
        --fsdp-devices); it must divide --devices. 1: data parallel, everything replicated.
      fsdp_min_size: Arrays smaller than this stay replicated under FSDP (openpi: 4MiB).
    """

    devices: int = 1
    fsdp: int = 1
    fsdp_min_size: Annotated[Size, tyro.conf.arg(name="fsdp-min-size")] = MIN_SHARD_BYTES

    def spec(self) -> MeshSpec:
        """The mesh, checked (one-line errors)."""
        return MeshSpec(self.devices, self.fsdp, self.fsdp_min_size).validate()


def example_name(example: str | None) -> str:
    """The example to use: the one named, else the default; an empty name is an error, not the default."""
    from jaxfit.examples import DEFAULT_EXAMPLE

    if example is not None and not example.strip():
        raise JaxfitError(f"--example {example!r} names no example; see `jaxfit examples` (default: {DEFAULT_EXAMPLE})")
    return example or DEFAULT_EXAMPLE


def consoles(quiet: bool) -> tuple[Console, ProgressPrinter | None]:
    """The console for results (stdout) and, unless ``quiet``, the progress printer (stderr)."""
    from jaxfit.cli.output import ProgressPrinter

    out = Console() if sys.stdout.isatty() else Console(width=160)
    return out, (None if quiet else ProgressPrinter(Console(stderr=True)))


def no_command(name: str) -> None:
    """Refuse a command after ``--`` where the subcommand takes none."""
    if COMMAND:
        raise JaxfitError(f"jaxfit {name} takes no command after --")


FLAGS_WITH_FLAG_VALUES = ("--batch-flag", "--accum-flag", "--probe-arg")
"""Options whose value is itself a flag (``--batch-flag --config.batch_size``), joined with ``=``
before tyro parses them, since it would read the value as an option of its own."""


def join_flag_values(args: list[str]) -> list[str]:
    """``["--batch-flag", "--bs"]`` -> ``["--batch-flag=--bs"]`` for :data:`FLAGS_WITH_FLAG_VALUES`."""
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in FLAGS_WITH_FLAG_VALUES and i + 1 < len(args):
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


def unknown_command(name: str) -> str:
    """The one-line refusal of a subcommand that does not exist, with the closest one when there is one."""
    import difflib

    close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown command {name!r}{hint}; the commands are {', '.join(SUBCOMMANDS)} (see jaxfit --help)"


_REAL_STDERR: list[Any] = []


def parsed(replay: bool = True) -> None:
    """Called first by every command: tyro is done, stderr is the terminal's again (and gets what
    was written meanwhile, unless ``replay`` is off: a parsing error is said in one line instead)."""
    if _REAL_STDERR:
        held = sys.stderr
        sys.stderr = _REAL_STDERR.pop()
        text = held.getvalue() if replay and hasattr(held, "getvalue") else ""
        if text:
            sys.stderr.write(text)


def one_line(box: str) -> str:
    """tyro's boxed parsing error as one line: its title and its first section."""
    lines = [line.strip().strip("│╭╮╰╯").strip() for line in box.splitlines()]
    title = ""
    if lines and lines[0].startswith("─"):
        title = lines[0].strip("─ ").strip()
    body: list[str] = []
    for line in lines[1:]:
        if line.startswith("────"):
            break
        if line and not line.startswith("─"):
            body.append(line)
    text = " ".join(" ".join(body).split())
    if title and not text.lower().startswith(title.lower()):
        text = f"{title.lower()}: {text}"
    return text or " ".join(box.split())


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where jaxfit is, so that it shuts down as cleanly as on Ctrl-C (children stopped)."""


def _terminate(signum: int, _frame: Any) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxfit`` console script. Returns the exit code.

    Every error is one line ``jaxfit: error: ...`` with exit code 2: jaxfit's own, and tyro's
    parsing errors (held back while tyro parses, then folded into one line with the help to read).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        split = args.index("--")
        COMMAND[:] = args[split + 1 :]
        args = args[:split]
    if not args:
        args = ["fit"]
    if args[0] in ("--version", "-V"):
        from jaxfit.versions import jaxfit_version

        print(f"jaxfit {jaxfit_version()}")
        return 0
    if not args[0].startswith("-") and args[0] not in SUBCOMMANDS:
        print(f"jaxfit: error: {unknown_command(args[0])}", file=sys.stderr)
        return 2
    args = join_flag_values(args)
    _REAL_STDERR[:] = [sys.stderr]
    sys.stderr = io.StringIO()
    try:
        previous_term = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave SIGTERM alone
        previous_term = None
    try:
        code = app.cli(
            prog="jaxfit", args=args, description="jaxfit: ask the XLA compiler what fits, before an OOM does."
        )
    except SystemExit as e:
        held = sys.stderr
        parsed(replay=e.code != 2)
        if e.code == 2 and isinstance(held, io.StringIO):  # tyro's parsing error, held back
            command = next((a for a in args if not a.startswith("-")), "")
            command = command if command in SUBCOMMANDS else ""
            print(
                f"jaxfit: error: {one_line(held.getvalue())}; see jaxfit {command + ' ' if command else ''}--help",
                file=sys.stderr,
            )
            return 2
        raise
    except JaxfitError as e:
        parsed()
        print(f"jaxfit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        parsed()
        if isinstance(e, Terminated):
            print("jaxfit: terminated", file=sys.stderr)
            return 128 + signal.SIGTERM
        print("jaxfit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `jaxfit ... | head`: the reader left; nothing more to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
        return 0
    finally:
        parsed()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
    return code if isinstance(code, int) else 0
