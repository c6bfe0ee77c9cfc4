"""Rules for the training job as a whole: its trainer config, world size, rendezvous host, ports,
and where the run and the node-local checkpoint tier write."""

from __future__ import annotations

import yaml

from infra import pod_security
from nvrx_eks.facts import job_names
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import InstanceFacts
from nvrx_eks.facts.names import FSX_MOUNT_PATH
from nvrx_eks.facts.user_yaml import load_user_yaml
from nvrx_eks.jobs.spec import (
    TRAIN_CONFIG_KEY,
    fsx_path_problem,
    own_run_dir_problem,
    parent_component_problem,
)
from nvrx_eks.jobs.validate.findings import Finding, document_id, format_path
from nvrx_eks.jobs.validate.rules.base import MISSING, PodSite, get
from nvrx_eks.jobs.validate.rules.entrypoint import EntrypointRules
from nvrx_eks.jobs.validate.rules.pods import PodRules
from nvrx_eks.jobs.validate.rules.policy import PolicyRules
from nvrx_eks.jobs.validate.rules.security import SecurityRules
from workloads.config import TrainConfig


class TrainingRules(PodRules, SecurityRules, PolicyRules, EntrypointRules):
    """A training JobSet or PyTorchJob, with the trainer config in its ConfigMap."""

    def _check_training_job(self, job: dict) -> None:
        name = get(job, ["metadata", "name"])
        is_jobset = job["kind"] == "JobSet"
        container_name = None if is_jobset else job_names.PYTORCHJOB_CONTAINER
        sites = self._pod_sites(job, container_name)
        if not sites:
            self.error(["spec"], "no pod templates")
            return
        train, train_path = self._train_config(sites)
        facts: InstanceFacts | None = None
        for site in sites:
            facts = self._instance_facts(site) or facts
            self._check_scheduling(site)
            self._check_image(site)
            self._check_security(site)
            self._check_restricted(site)
            self._check_volumes(site, needs_config=True)
            if facts is not None:
                self._check_resources(site, facts)
        if facts is None:
            return

        nodes = self._node_count(job, sites)
        # Hot spare nodes are launched but outside the active world (workloads/spares.py).
        spares = train.distributed.spare_nodes if train is not None else 0
        world_size = (nodes - spares) * facts.gpus if nodes is not None else None
        if world_size is not None:
            annotation = get(job, ["metadata", "annotations", job_names.WORLD_SIZE_ANNOTATION])
            if annotation is not MISSING and str(annotation) != str(world_size):
                self.error(
                    ["metadata", "annotations", job_names.WORLD_SIZE_ANNOTATION],
                    f"says {annotation}, but {nodes} nodes"
                    + (f" less {spares} spare(s)" if spares else "")
                    + f" x {facts.gpus} GPUs = {world_size}",
                )
        expected_host = job_names.rendezvous_host("jobset" if is_jobset else "pytorchjob", str(name))
        self._check_failure_policy(job, sites, spares)
        self._check_deadline(job, train)
        if not is_jobset:
            self._check_pytorchjob_ports(sites)
        for site in sites:
            self._check_entrypoint(site, train, nodes, facts, world_size, expected_host, str(name))
            if train is not None and train.checkpoint.local.enabled:
                self._check_local_tier_mount(site, train, train_path)
        if train is not None and world_size is not None:
            from workloads.faults import outside_world, parse_fault_spec

            for fault in outside_world(parse_fault_spec(train.faults), world_size):
                self.findings.append(
                    Finding(
                        "project",
                        train_path[0],
                        format_path(train_path[1] + ["faults"]),
                        f"{fault.label} targets rank {fault.rank}, but the job has {world_size} ranks",
                    )
                )

            # Where the run writes must be the job's own directory on FSx; the data it reads (which
            # may be baked into the image) must at least not climb out of where it is placed.
            def written(path: str) -> str | None:
                return fsx_path_problem(path) or own_run_dir_problem(path, str(name))

            paths = [("run_dir", train.run_dir, written), ("checkpoint.dir", train.checkpoint_dir, written)]
            if train.data.path:
                paths.append(("data.path", train.data.path, parent_component_problem))
            for label, value, check in paths:
                problem = check(str(value))
                if problem:
                    self.findings.append(
                        Finding("project", train_path[0], format_path(train_path[1] + label.split(".")), problem)
                    )

    def _check_local_tier_mount(self, site: PodSite, train: TrainConfig, train_path: tuple[str, list]) -> None:
        """Tier on -> checkpoint.local.dir is a mount of the reviewed node-local root. Anything
        else puts the "node-local" copies in the container's writable layer (gone with the pod,
        on the root volume) or on FSx (no faster than the tier it should spare)."""
        local_dir = train.local_checkpoint_dir
        if local_dir == FSX_MOUNT_PATH or local_dir.startswith(FSX_MOUNT_PATH + "/"):
            self.findings.append(
                Finding(
                    "project",
                    train_path[0],
                    format_path(train_path[1] + ["checkpoint", "local", "dir"]),
                    f"{local_dir!r} is on FSx; the local tier belongs on the node's instance store "
                    f"(mounted from {pod_security.LOCAL_CHECKPOINT_HOST_PATH})",
                )
            )
            return
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index, "volumeMounts"]
        volumes = {v.get("name"): v for v in get(site.pod, ["spec", "volumes"]) or [] if isinstance(v, dict)}
        for mount in site.container.get("volumeMounts") or []:
            if isinstance(mount, dict) and mount.get("mountPath") == local_dir:
                host_path = get(volumes.get(mount.get("name")) or {}, ["hostPath", "path"])
                if host_path == pod_security.LOCAL_CHECKPOINT_HOST_PATH:
                    return
        self.error(
            cpath,
            f"checkpoint.local.interval_steps turns the node-local tier on, but nothing from the node's "
            f"instance store ({pod_security.LOCAL_CHECKPOINT_HOST_PATH}) is mounted at checkpoint.local.dir "
            f"{local_dir}; render the job with nvrx-eks render, or set checkpoint.local.interval_steps=null",
        )

    def _train_config(self, sites: list[PodSite]) -> tuple[TrainConfig | None, tuple[str, list]]:
        """The TrainConfig in the ConfigMap the pods mount, parsed and validated."""
        name = None
        for site in sites:
            for volume in get(site.pod, ["spec", "volumes"]) or []:
                if isinstance(volume, dict) and "configMap" in volume:
                    name = get(volume, ["configMap", "name"])
        config_map = next(
            (d for d in self.documents if d.get("kind") == "ConfigMap" and get(d, ["metadata", "name"]) == name), None
        )
        if config_map is None:
            return None, ("(missing ConfigMap)", [])
        doc_id = document_id(config_map)
        key_path = ["data", TRAIN_CONFIG_KEY]
        text = get(config_map, key_path)
        if not isinstance(text, str):
            self.findings.append(Finding("project", doc_id, format_path(key_path), "missing: the trainer config YAML"))
            return None, (doc_id, key_path)
        try:
            source = f"{doc_id} {TRAIN_CONFIG_KEY}"
            data = load_user_yaml(text, source)
            train = TrainConfig.from_dict(data if isinstance(data, dict) else {}, source=source)
        except yaml.YAMLError as e:
            self.findings.append(Finding("project", doc_id, format_path(key_path), f"not valid YAML: {e}"))
            return None, (doc_id, key_path)
        except ConfigError as e:
            for field_path, message in e.issues:
                self.findings.append(Finding("project", doc_id, format_path(key_path + list(field_path)), message))
            return None, (doc_id, key_path)
        return train, (doc_id, key_path)

    def _check_pytorchjob_ports(self, sites: list[PodSite]) -> None:
        for site in sites:
            if site.container is None:
                continue
            ports = site.container.get("ports") or []
            if not any(isinstance(p, dict) and p.get("name") == job_names.PYTORCHJOB_PORT_NAME for p in ports):
                self.error(
                    site.path + ["spec", "containers", site.container_index, "ports"],
                    f"needs a port named {job_names.PYTORCHJOB_PORT_NAME}: the training operator builds the master "
                    "service from it",
                )
