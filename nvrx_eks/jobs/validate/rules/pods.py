"""Rules for every pod of a job: the GPU node it lands on, what it requests, the volumes it mounts
and the image it runs."""

from __future__ import annotations

import re

from nvrx_eks.facts import names as conventions
from nvrx_eks.facts.instances import INSTANCE_FACTS, InstanceFacts
from nvrx_eks.facts.names import FSX_MOUNT_PATH
from nvrx_eks.jobs.spec import OFFLINE_PLACEHOLDER_IMAGE, TRAIN_CONFIG_DIR
from nvrx_eks.jobs.validate.rules.base import MISSING, PodSite, RuleBase, get, node_replicated_jobs


class PodRules(RuleBase):
    """Checks of one pod template of the job (a PodSite)."""

    def _pod_sites(self, job: dict, container_name: str | None) -> list[PodSite]:
        sites = []
        if job["kind"] == "JobSet":
            for i, rj in node_replicated_jobs(job):
                path = ["spec", "replicatedJobs", i, "template", "spec", "template"]
                sites.append(self._site(job, path, container_name, str(get(rj, ["name"]))))
        else:
            specs = get(job, ["spec", "pytorchReplicaSpecs"])
            for rtype in specs if isinstance(specs, dict) else {}:
                path = ["spec", "pytorchReplicaSpecs", rtype, "template"]
                sites.append(self._site(job, path, container_name, rtype))
        return sites

    def _site(self, job: dict, path: list, container_name: str | None, role: str) -> PodSite:
        pod = get(job, path)
        pod = pod if isinstance(pod, dict) else {}
        containers = get(pod, ["spec", "containers"])
        index, container = None, None
        if isinstance(containers, list):
            for i, c in enumerate(containers):
                if isinstance(c, dict) and (container_name is None or c.get("name") == container_name):
                    index, container = i, c
                    break
        if container is None:
            self.error(
                path + ["spec", "containers"],
                f"no container named {container_name!r}" if container_name else "no containers",
            )
        return PodSite(path, pod, index, container, role)

    def _instance_facts(self, site: PodSite) -> InstanceFacts | None:
        selector_path = site.path + ["spec", "nodeSelector", conventions.INSTANCE_TYPE_LABEL_KEY]
        instance_type = get(site.pod, ["spec", "nodeSelector", conventions.INSTANCE_TYPE_LABEL_KEY])
        if instance_type is MISSING:
            self.error(selector_path, f"missing: pods must select the GPU instance type {self.expected.instance_type}")
            return INSTANCE_FACTS.get(self.expected.instance_type)
        if instance_type != self.expected.instance_type:
            self.error(
                selector_path,
                f"is {instance_type!r}, but this deployment's GPU nodes are {self.expected.instance_type}; "
                "no node would match",
            )
        return INSTANCE_FACTS.get(self.expected.instance_type)

    def _check_scheduling(self, site: PodSite) -> None:
        spec_path = site.path + ["spec"]
        label = get(site.pod, ["spec", "nodeSelector", conventions.GPU_NODE_LABEL_KEY])
        if label != conventions.GPU_NODE_LABEL_VALUE:
            self.error(
                spec_path + ["nodeSelector", conventions.GPU_NODE_LABEL_KEY],
                f"must be {conventions.GPU_NODE_LABEL_VALUE!r} to land on the GPU node group (got {label})",
            )
        tolerations = get(site.pod, ["spec", "tolerations"])
        tolerated = isinstance(tolerations, list) and any(
            isinstance(t, dict)
            and t.get("key") == conventions.GPU_TAINT_KEY
            and t.get("effect") in (conventions.GPU_TAINT_EFFECT, None)
            and (t.get("operator") == "Exists" or t.get("value") == conventions.GPU_TAINT_VALUE)
            for t in tolerations
        )
        if not tolerated:
            self.error(
                spec_path + ["tolerations"],
                f"no toleration for the GPU taint {conventions.GPU_TAINT_KEY}={conventions.GPU_TAINT_VALUE}:"
                f"{conventions.GPU_TAINT_EFFECT}; the pods would never schedule on GPU nodes",
            )

    def _check_resources(self, site: PodSite, facts: InstanceFacts) -> None:
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index]
        for section in ("requests", "limits"):
            for resource, expected, what in (
                (conventions.GPU_RESOURCE, facts.gpus, "GPUs"),
                (conventions.EFA_RESOURCE, facts.efa_interfaces, "EFA interfaces"),
            ):
                value = get(site.container, ["resources", section, resource])
                path = cpath + ["resources", section, resource]
                if value is MISSING:
                    self.error(path, f"missing; a {facts.instance_type} pod takes all {expected} of its {resource}")
                elif str(value) != str(expected):
                    self.error(
                        path,
                        f"is {value}, but {facts.instance_type} has {expected} {what}; "
                        "one pod per node must take all of them",
                    )
        # Requests within what the node can give a pod: (resource, parser, allocatable, its words).
        for resource, amount, allocatable, words, what in (
            ("cpu", _cpu_cores, facts.allocatable_vcpus, f"{facts.allocatable_vcpus} vCPUs", "vCPUs"),
            ("memory", memory_gib, facts.allocatable_memory_gib, f"{facts.allocatable_memory_gib}Gi", "memory"),
        ):
            path = cpath + ["resources", "requests", resource]
            requested = get(site.container, ["resources", "requests", resource])
            if requested is MISSING:
                self.error(path, f"missing; request the node's allocatable {what}")
            elif (quantity := amount(requested)) is None or quantity > allocatable:
                self.error(path, f"{requested} exceeds the {words} allocatable on {facts.instance_type}")

    def _check_volumes(self, site: PodSite, *, needs_config: bool) -> None:
        spec_path = site.path + ["spec"]
        volumes = get(site.pod, ["spec", "volumes"])
        volumes = volumes if isinstance(volumes, list) else []
        by_name = {v.get("name"): (i, v) for i, v in enumerate(volumes) if isinstance(v, dict)}
        if site.container is not None:
            cpath = spec_path + ["containers", site.container_index]
            mounts = site.container.get("volumeMounts") or []
            mount_by_path = {}
            for j, m in enumerate(mounts if isinstance(mounts, list) else []):
                if not isinstance(m, dict):
                    continue
                mount_by_path[m.get("mountPath")] = (j, m)
                if m.get("name") not in by_name:
                    self.error(
                        cpath + ["volumeMounts", j, "name"],
                        f"mounts volume {m.get('name')!r}, which the pod does not define",
                    )
        else:
            cpath, mount_by_path = spec_path, {}

        # FSx claim at /fsx: checkpoints and data must outlive pods.
        fsx = next(((i, v) for i, v in by_name.values() if "persistentVolumeClaim" in v), None)
        if fsx is None:
            self.error(spec_path + ["volumes"], f"no volume for the FSx claim {self.expected.pvc_name!r}")
        else:
            i, volume = fsx
            claim = get(volume, ["persistentVolumeClaim", "claimName"])
            if claim != self.expected.pvc_name:
                self.error(
                    spec_path + ["volumes", i, "persistentVolumeClaim", "claimName"],
                    f"is {claim!r}, but the deployment's FSx claim is {self.expected.pvc_name!r}",
                )
            mount = mount_by_path.get(FSX_MOUNT_PATH)
            if site.container is not None and (mount is None or mount[1].get("name") != volume.get("name")):
                self.error(cpath + ["volumeMounts"], f"the FSx claim must be mounted at {FSX_MOUNT_PATH}")

        # /dev/shm: memory-backed and bounded.
        shm_mount = mount_by_path.get("/dev/shm")
        if shm_mount is None:
            self.error(
                cpath + ["volumeMounts"], "nothing mounted at /dev/shm; NCCL and DataLoader workers need a large one"
            )
        else:
            entry = by_name.get(shm_mount[1].get("name"))
            if entry is not None:
                i, volume = entry
                if get(volume, ["emptyDir", "medium"]) != "Memory":
                    self.error(
                        spec_path + ["volumes", i, "emptyDir", "medium"],
                        "/dev/shm must be an emptyDir with medium Memory",
                    )
                if get(volume, ["emptyDir", "sizeLimit"]) is MISSING:
                    self.error(
                        spec_path + ["volumes", i, "emptyDir", "sizeLimit"],
                        "missing; an unbounded memory volume lets one writer exhaust the pod's memory",
                    )

        if needs_config:
            config = next(((i, v) for i, v in by_name.values() if "configMap" in v), None)
            if config is None:
                self.error(spec_path + ["volumes"], "no ConfigMap volume with the trainer config")
            else:
                i, volume = config
                name = get(volume, ["configMap", "name"])
                if not any(
                    d.get("kind") == "ConfigMap" and get(d, ["metadata", "name"]) == name for d in self.documents
                ):
                    self.error(
                        spec_path + ["volumes", i, "configMap", "name"],
                        f"ConfigMap {name!r} is not among the documents; render it with the job",
                    )
                mount = mount_by_path.get(TRAIN_CONFIG_DIR)
                if site.container is not None and (mount is None or mount[1].get("name") != volume.get("name")):
                    self.error(cpath + ["volumeMounts"], f"the trainer config must be mounted at {TRAIN_CONFIG_DIR}")

    def _check_image(self, site: PodSite, *, restarted: bool = True) -> None:
        """`restarted`: pods of this job are recreated later (training), so a moving tag could
        mix code versions within one run; a one-shot test only gets a warning."""
        if site.container is None:
            return
        path = site.path + ["spec", "containers", site.container_index, "image"]
        image = site.container.get("image")
        if not isinstance(image, str) or not image.strip():
            self.error(path, "no image; give --image or deploy (the stack exports TrainerImageUri)")
        elif image == OFFLINE_PLACEHOLDER_IMAGE:
            message = "is the offline placeholder; a cluster cannot pull it (submit uses the deployed image)"
            (self.error if self.expected.live else self.warning)(path, message)
        elif "@sha256:" not in image and (":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")):
            if restarted:
                self.error(path, f"{image!r} has no fixed tag; pods restarted later could run different code")
            else:
                self.warning(path, f"{image!r} has no fixed tag; pin a digest to compare fabric results over time")


def _cpu_cores(value) -> float | None:
    text = str(value)
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return None


_MEMORY_UNITS = {
    "Ki": 2**-20,
    "Mi": 2**-10,
    "Gi": 1,
    "Ti": 2**10,
    "K": 1e3 / 2**30,
    "M": 1e6 / 2**30,
    "G": 1e9 / 2**30,
    "T": 1e12 / 2**30,
}


def memory_gib(value) -> float | None:
    """A Kubernetes memory quantity (`922Gi`, `1e9`... `512M`) in GiB; None when it is not one."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", str(value))
    if not match:
        return None
    number, unit = float(match[1]), match[2]
    return number / 2**30 if unit is None else number * _MEMORY_UNITS[unit]
