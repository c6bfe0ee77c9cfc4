"""JobOptions: the flags that describe a job (render, validate, submit), each declared once with
its type, default and help, and @job_flags, which gives a Typer command all of them as one
JobOptions. Cheap to import: the CLI builds its commands from it before any command runs.
"""

from __future__ import annotations

import functools
import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import typer
from yaml.reader import Reader

from nvrx_eks.facts.errors import ConfigError

#: What a job runs: the trainer, or the NCCL/EFA fabric test.
Workload = Literal["train", "nccl-test"]

#: The longest a healthy training step may be said to take (--max-step-time-s, and the measured
#: step time `plan` takes): a day. Beyond it a figure is a typo, and `inf` or 1e308 would give a
#: job deadline no integer holds.
MAX_STEP_TIME_S = 24 * 3600.0

#: The flags of render, validate and submit that describe the job: name -> (type, Typer option).
JOB_FLAGS: dict[str, tuple[object, Any]] = {
    "nodes": (
        int | None,
        typer.Option(None, "--nodes", "-n", min=1, help="GPU nodes (default: desired_size, or max_size if 0)."),
    ),
    "api": (str, typer.Option("jobset", "--api", help="jobset (default) or pytorchjob (needs the training operator).")),
    "fabric_test": (
        bool,
        typer.Option(False, "--fabric-test", help="The NCCL/EFA nccl-tests all_reduce smoke job instead of training."),
    ),
    "name": (
        str | None,
        typer.Option(None, "--name", help="Job name (default: train, or nccl-test with --fabric-test)."),
    ),
    "image": (
        str | None,
        typer.Option(
            None,
            "--image",
            help="Container image. Offline default: the profile's image.uri, else a localhost/ placeholder; "
            "live: the stack's.",
        ),
    ),
    "train_config": (
        str | None,
        typer.Option(None, "--train-config", help="Trainer config YAML (default: the trainer's defaults)."),
    ),
    "overrides": (
        list[str] | None,
        typer.Option(None, "--set", help="Trainer config override KEY=VALUE (repeatable), e.g. steps=500."),
    ),
    "faults": (
        str | None,
        typer.Option(None, "--faults", help="Fault-injection spec passed to the trainer, e.g. sigkill@50:3."),
    ),
    "max_restarts": (int, typer.Option(3, "--max-restarts", min=0, help="Whole-job restarts by Kubernetes (layer 3).")),
    "max_step_time_s": (
        float | None,
        typer.Option(
            None,
            "--max-step-time-s",
            help="Longest healthy training step; sizes the job's deadline "
            "(default: the trainer's step section timeout).",
        ),
    ),
    "data": (
        str | None,
        typer.Option(
            None,
            "--data",
            help="Token shards for the job: a `data prepare` directory on FSx (relative paths under /fsx) "
            "or its s3://<data bucket>/<data prefix>/... URL.",
        ),
    ),
    "trainer": (
        str | None,
        typer.Option(
            None,
            "--trainer",
            help="Your own trainer instead of this project's: a Python module in the image, or the absolute path "
            "of a .py script (e.g. on the claim under /fsx). It must keep the contract in workloads/README.md.",
        ),
    ),
    "spare_nodes": (
        int,
        typer.Option(
            0,
            "--spare-nodes",
            min=0,
            help="Hot spare nodes launched beyond the --nodes active ones: only those train (spares change "
            "neither the world nor the global batch), and a spare takes a lost node's place in process.",
        ),
    ),
}


def _default(flag: str) -> Any:
    return JOB_FLAGS[flag][1].default


@dataclass
class JobOptions:
    """The job as the flags describe it; unset fields take the flags' defaults."""

    nodes: int | None = _default("nodes")
    api: str = _default("api")
    fabric_test: bool = _default("fabric_test")
    name: str | None = _default("name")
    image: str | None = _default("image")
    train_config: str | None = _default("train_config")
    overrides: list[str] = field(default_factory=list)
    faults: str | None = _default("faults")
    max_restarts: int = _default("max_restarts")
    max_step_time_s: float | None = _default("max_step_time_s")
    spare_nodes: int = _default("spare_nodes")
    trainer: str | None = _default("trainer")
    #: --data as typed; where the pods read it needs the deployment (nvrx_eks.jobs.data_path.data_in_pods,
    #: called by nvrx_eks.jobs.commands.build_spec).
    data: str | None = None
    #: Not a flag: ranks per pod where they are not one per GPU (`nvrx-eks rehearse` on CPUs).
    ranks_per_node: int | None = None

    @property
    def workload(self) -> Workload:
        return "nccl-test" if self.fabric_test else "train"

    @classmethod
    def from_flags(cls, *, overrides: list[str] | None, data: str | None = None, **flags: Any) -> JobOptions:
        """The options as typed, checked where a flag's own type cannot say it (ConfigError)."""
        for item in overrides or []:
            _check_yaml_text(f"--set {item.partition('=')[0].strip()}", item)
        if data is not None:
            _check_yaml_text("--data", data)
        check_step_time("--max-step-time-s", flags.get("max_step_time_s"))
        return cls(overrides=list(overrides or []), data=data, **flags)


def _check_yaml_text(flag: str, text: str) -> None:
    """The values reach the manifests, which are YAML: a character YAML cannot hold (a control
    character such as U+0001) would make the rendered manifest unreadable, so it is refused here,
    named, rather than found by the YAML parser."""
    found = Reader.NON_PRINTABLE.search(text)
    if found:
        raise ConfigError(
            f"{flag}: holds the control character U+{ord(found.group()):04X}, which a manifest cannot carry; "
            "remove it (check for a stray escape or paste)"
        )


def check_step_time(flag: str, seconds: float | None) -> None:
    """A step time (`flag`) above 0 and at most MAX_STEP_TIME_S; None is unset and passes."""
    if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_STEP_TIME_S):
        raise ConfigError(
            f"{flag} {seconds:g}: give the seconds of one training step, above 0 and at most "
            f"{MAX_STEP_TIME_S:g} (a day)"
        )


def data_overrides(data: str | None) -> list[str]:
    """--data PATH: train on the token shards there (the trainer checks them against its manifest)."""
    return [] if data is None else ["data.source=memmap", f"data.path={data}"]


#: The default of a command's `options` parameter: @job_flags puts the job flags in its place.
FROM_JOB_FLAGS: Any = None


def job_flags(*, without: tuple[str, ...] = ()) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a Typer command the JOB_FLAGS (less `without`) where its `options` parameter stands;
    it receives them as one JobOptions in `options`. Typer reads the command's signature, so the
    wrapper carries the rewritten one."""
    flags = {name: flag for name, flag in JOB_FLAGS.items() if name not in without}

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(command, include_extras=True)  # keeps Annotated options
        parameters: list[inspect.Parameter] = []
        for parameter in inspect.signature(command).parameters.values():
            if parameter.name == "options":
                parameters += [
                    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
                    for name, (kind, option) in flags.items()
                ]
            else:
                keyword = parameter.replace(annotation=hints[parameter.name], kind=inspect.Parameter.KEYWORD_ONLY)
                parameters.append(keyword)

        @functools.wraps(command)
        def with_options(**values: Any) -> None:
            options = JobOptions.from_flags(**{name: values.pop(name) for name in flags})
            command(**values, options=options)

        with_options.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_options

    return decorate
