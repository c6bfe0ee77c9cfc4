"""`--spare-nodes` means the same in `nvrx-eks local` as in render/submit/validate (and rehearse,
which renders): `--nodes N` active nodes train, `--spare-nodes K` hot spares are launched beyond
them. The same flags give the same job: checked up to where `local` would start its launchers,
so no trainer runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvrx_eks.deploy.deployment import load_deployment
from nvrx_eks.facts.job_names import SPARE_NODES_ANNOTATION, WORLD_SIZE_ANNOTATION
from nvrx_eks.jobs.commands import DEFAULT_JOB_NAME, JobOptions, build_spec
from nvrx_eks.jobs.render import render_job
from nvrx_eks.local import runner, supervisor
from tests.support.cli_harness import run_cli
from tests.support.profiles import profile_file


class _LaunchReached(Exception):
    """Raised where `local` would start the coordinator and the launchers."""


def _rendered_job(tmp_path, *, nodes: int, spare_nodes: int) -> dict[str, int]:
    """The job render builds for `--nodes nodes --spare-nodes spare_nodes` of `local`'s CPU trainer
    config, one rank per node (as `rehearse` renders and runs it), in a profile whose node group
    holds every launched node."""
    config = profile_file(tmp_path / "profile", gpu_nodes__max_size=nodes + spare_nodes)
    train = runner.local_config(
        # In the job's own directory on the claim, the only run_dir render places a job in.
        run_dir=Path("runs") / DEFAULT_JOB_NAME["train"],
        steps=10,
        faults="",
        preset="tiny",
        checkpoint_interval=5,
        backend="nvrx",
    )
    (train_config := tmp_path / "train.yaml").write_text(train.to_yaml())
    options = JobOptions(nodes=nodes, spare_nodes=spare_nodes, ranks_per_node=1, train_config=str(train_config))
    job = render_job(build_spec(load_deployment(None, str(config)), options, None)).job_document
    annotations = job["metadata"]["annotations"]
    [workers] = [rj for rj in job["spec"]["replicatedJobs"] if rj["name"] != "coordinator"]
    return {
        "world_size": int(annotations[WORLD_SIZE_ANNOTATION]),
        "launched_nodes": workers["replicas"] * workers["template"]["spec"]["parallelism"],
        "spare_nodes": int(annotations.get(SPARE_NODES_ANNOTATION, "0")),  # none without spares
    }


def _local_launch(tmp_path, monkeypatch, *flags: str) -> dict[str, Any]:
    """What `nvrx-eks local --nproc 1 FLAGS` would start: the world its preflight checks, the
    launchers' argvs and the trainer config they share."""
    seen: dict[str, Any] = {}

    def preflight(config_path, world_size, env, console) -> list[str]:
        seen["world_size"] = world_size
        return []

    def start_launch(cfg, nnodes, launcher_argvs, *_rest) -> None:
        seen.update(cfg=cfg, nnodes=nnodes, argvs=launcher_argvs)
        raise _LaunchReached

    monkeypatch.setattr(runner, "preflight", preflight)
    monkeypatch.setattr(supervisor, "start_launch", start_launch)
    with pytest.raises(_LaunchReached):
        run_cli("local", "--nproc", "1", *flags, "--run-dir", str(tmp_path / "run"))
    return seen


@pytest.mark.parametrize(("nodes", "spare_nodes"), [(2, 1), (1, 2), (2, 0)])
def test_local_starts_the_job_render_describes_for_the_same_flags(tmp_path, monkeypatch, nodes, spare_nodes):
    rendered = _rendered_job(tmp_path, nodes=nodes, spare_nodes=spare_nodes)
    launch = _local_launch(tmp_path, monkeypatch, "--nodes", str(nodes), "--spare-nodes", str(spare_nodes))
    started = {
        "world_size": launch["world_size"],
        "launched_nodes": len(launch["argvs"]),
        "spare_nodes": launch["cfg"].distributed.spare_nodes,
    }
    assert (
        started == rendered == {"world_size": nodes, "launched_nodes": nodes + spare_nodes, "spare_nodes": spare_nodes}
    )
    # Every launcher joins a rendezvous of all the launched nodes, spares included, as each pod does.
    assert launch["nnodes"] == nodes + spare_nodes
    assert {argv[argv.index("--nnodes") + 1] for argv in launch["argvs"]} == {str(nodes + spare_nodes)}


def test_adding_spares_to_a_local_run_keeps_its_training_world(tmp_path, monkeypatch):
    without = _local_launch(tmp_path / "without", monkeypatch, "--nodes", "2")
    with_spare = _local_launch(tmp_path / "with", monkeypatch, "--nodes", "2", "--spare-nodes", "1")
    assert without["world_size"] == with_spare["world_size"] == 2
    assert len(with_spare["argvs"]) == len(without["argvs"]) + 1


def test_local_and_the_cluster_commands_share_one_spare_nodes_help():
    helps = {command: run_cli(command, "--help").stdout for command in ("local", "rehearse", "render")}
    wording = "Hot spare nodes launched beyond the --nodes active ones"
    assert all(wording in " ".join(text.replace("│", " ").split()) for text in helps.values()), helps
