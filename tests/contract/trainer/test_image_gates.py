"""Gates for the trainer image that need no Docker: the Dockerfile's COPY lines and .dockerignore
state the one list of what the image holds, the build context the CDK asset stages holds every
COPY source, the image's Python requirements resolve for its platform against the package
index, the Dockerfile passes hadolint and its ENV agrees with the pod env, and every shell
script the project ships or renders passes shellcheck."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.facts.image_contents import BUILD_INPUTS, CODE, DOCKERFILE, context_patterns
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from scripts.trainer_requirements import trainer_requirements
from tests.support import REPO_ROOT, checkout_files
from tests.support.shell_lint import assert_shellcheck_clean
from workloads import transport
from workloads.process_env import TRAINER_PROCESS_ENV, nccl_version_problem

ROOT = REPO_ROOT
VENV_BIN = Path(sys.executable).parent

# --- Dockerfile and .dockerignore, read as Docker reads them ----------------------------------


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, continuation lines joined."""
    joined, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    result = []
    for text in joined:
        keyword, _, args = text.strip().partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def copy_sources(dockerfile: str) -> list[str]:
    """Context paths that COPY/ADD read (sources copied from another stage are not context)."""
    sources = []
    for keyword, args in instructions(dockerfile):
        if keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from=") for f in flags):
            continue
        paths = [w for w in words if not w.startswith("--")]
        sources += paths[:-1]
    return sources


def env_of(dockerfile: str) -> dict[str, str]:
    """Every ENV KEY=VALUE the Dockerfile sets (the last one wins, as in the image)."""
    env = {}
    for keyword, args in instructions(dockerfile):
        if keyword == "ENV":
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def _dockerignore_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out, i = out[:-2] + "(?:.*/)?", i + 1
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: patterns in order, the last one matching the path or one of its parent
    directories decides; `!` re-includes."""
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip().strip("/")
        regex = _dockerignore_regex(pattern)
        parts = path.split("/")
        if any(regex.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


def read_dockerignore(directory: Path) -> list[str]:
    path = directory / ".dockerignore"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_dockerignore_matching_follows_dockers_rules():
    patterns = ["*", "!pyproject.toml", "!workloads/", "**/__pycache__"]
    assert dockerignore_excludes(patterns, "node_modules/x/y.js")
    assert not dockerignore_excludes(patterns, "pyproject.toml")
    assert not dockerignore_excludes(patterns, "workloads/train.py")
    assert dockerignore_excludes(patterns, "workloads/__pycache__/train.cpython-312.pyc")
    assert dockerignore_excludes(patterns, "nvrx_eks/cli/__init__.py")


# --- what the image holds: one list, restated where Docker reads it --------------------------


def test_the_dockerfile_copies_the_paths_the_image_contents_list():
    """A COPY line added or dropped without the list fails here, not in the image build or on a node."""
    sources = [source.rstrip("/") for source in copy_sources((ROOT / DOCKERFILE).read_text())]
    assert sorted(sources) == sorted(BUILD_INPUTS + CODE)


def test_dockerignore_states_the_image_contents_patterns():
    """Docker and podman (the CPU twin) read .dockerignore; the CDK asset stages from the list."""
    assert read_dockerignore(ROOT) == list(context_patterns())


def test_the_image_contents_patterns_admit_the_list_and_nothing_else():
    patterns = list(context_patterns())
    for path in BUILD_INPUTS + CODE:
        assert not dockerignore_excludes(patterns, path), path
    assert not dockerignore_excludes(patterns, "nvrx_eks/local/runner.py")
    for path in ("nvrx_eks/cli/demo.py", "nvrx_eks/ops/preflight.py", "app.py", "infra/stacks/cluster.py",
                 "workloads/__pycache__/train.cpython-312.pyc"):  # fmt: skip
        assert dockerignore_excludes(patterns, path), path


# --- the staged build context ---------------------------------------------------------------


@pytest.mark.synth
@pytest.mark.xdist_group("synth")
def test_every_copy_source_is_in_the_staged_build_context(synth):
    """What `cdk deploy` hands to `docker build`: the asset directory staged in cdk.out, with the
    Dockerfile the asset names, filtered once more by Docker through the staged .dockerignore."""
    synthesized = synth("p5")
    assets = json.loads((synthesized.outdir / f"{synthesized.stack_names['cluster']}.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    context = synthesized.outdir / image["source"]["directory"]
    dockerfile = context / image["source"].get("dockerFile", "Dockerfile")
    assert dockerfile.is_file(), f"{dockerfile.relative_to(context)} is not in the staged context"
    ignore = read_dockerignore(context)
    sources = copy_sources(dockerfile.read_text())
    assert sources, "the Dockerfile copies nothing from its context"
    for source in sources:
        matches = sorted(context.glob(source.rstrip("/"))) if any(c in source for c in "*?[") else [context / source]
        present = [m for m in matches if m.exists() and not dockerignore_excludes(ignore, str(m.relative_to(context)))]
        assert present, f"COPY source {source!r} is not in the staged build context {context}"


@pytest.mark.synth
@pytest.mark.xdist_group("synth")
def test_staged_context_is_what_the_image_contents_admit_from_the_checkout(synth):
    """CDK stages the files of the list of what the image holds, which Docker would send from the
    checkout: nothing more (no node_modules, .venv or caches), nothing less."""
    synthesized = synth("p5")
    assets = json.loads((synthesized.outdir / f"{synthesized.stack_names['cluster']}.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    context = synthesized.outdir / image["source"]["directory"]
    staged = {str(p.relative_to(context)) for p in context.rglob("*") if p.is_file()}
    patterns = list(context_patterns())
    admitted = {p for p in checkout_files() if not dockerignore_excludes(patterns, p)}
    assert staged == admitted | {".dockerignore"}


def test_the_gpu_smoke_runs_from_what_the_image_holds(tmp_path):
    """`python -m nvrx_eks.ops.gpu_smoke` in the image, on a node with its NCCL and EFA plugin:
    every module of ours it imports (the local runner it drives, the trainer's) comes from the
    files the image copies, none from this checkout. The image's third-party packages are the
    trainer extra's (test_image_requirements_resolve_for_python_312_manylinux_x86_64)."""
    import shutil

    patterns = list(context_patterns())
    for relative in checkout_files():
        if not dockerignore_excludes(patterns, relative) and relative != ".dockerignore":
            (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, tmp_path / relative)
    probe = (
        "import sys, json, runpy\n"
        "sys.argv = ['gpu_smoke', '--help']\n"
        "try:\n"
        "    runpy.run_module('nvrx_eks.ops.gpu_smoke', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "import nvrx_eks.local.runner, nvrx_eks.ops.gpu_smoke, nvrx_eks.ops.gpu_env\n"
        "ours = {m.__name__: getattr(m, '__file__', None) for m in list(sys.modules.values())\n"
        "        if m.__name__.split('.')[0] in ('nvrx_eks', 'workloads')}\n"
        "print(json.dumps(ours))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--budget-s" in result.stdout  # the smoke's own --help
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "nvrx_eks.ops.gpu_smoke" in loaded and "nvrx_eks.local.runner" in loaded
    assert "nvrx_eks.ops.gpu_env" in loaded  # the child that reads the GPUs (imported lazily)
    outside = {name: path for name, path in loaded.items() if path and not Path(path).is_relative_to(tmp_path)}
    assert outside == {}, f"imported from outside the image's files: {outside}"


# --- Python requirements of the image --------------------------------------------------------

#: The image's platform: Ubuntu 24.04 (glibc 2.39), CPython 3.12, x86_64. pip's --platform takes
#: one exact tag, so name every manylinux tag glibc 2.39 accepts, as pip does for a native install.
IMAGE_PYTHON = "3.12"
IMAGE_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]  # fmt: skip
INDEX_URL = "https://pypi.org/simple"


def _index_reachable() -> bool:
    try:
        with urllib.request.urlopen(f"{INDEX_URL}/pip/", timeout=15) as response:
            return response.status == 200
    except OSError:
        return False


def resolve_for_image(requirements: list[str], report: Path) -> tuple[subprocess.CompletedProcess, float]:
    """pip's resolver, as the image build would run it, without installing anything."""
    platforms = [arg for platform in IMAGE_PLATFORMS for arg in ("--platform", platform)]
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
            "--ignore-installed", "--only-binary=:all:", "--python-version", IMAGE_PYTHON, *platforms,
            "--index-url", INDEX_URL, *requirements]  # fmt: skip
    # The machine's pip configuration (local wheel directories, constraints) is not the image's.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_CONSTRAINT": ""}
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    return result, time.monotonic() - started


needs_index = pytest.mark.skipif(not _index_reachable(), reason=f"package index {INDEX_URL} is not reachable: "
                                 "the image requirement resolution gate needs it")  # fmt: skip


@needs_index
def test_image_requirements_resolve_for_python_312_manylinux_x86_64(tmp_path):
    requirements = trainer_requirements()
    result, seconds = resolve_for_image(requirements, tmp_path / "report.json")
    assert result.returncode == 0, f"pip could not resolve {requirements} in {seconds:.0f} s:\n{result.stderr}"
    installed = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads((tmp_path / "report.json").read_text())["install"]
    }
    for requirement in requirements:
        name = re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0].lower()
        assert name in installed, f"{name} missing from the resolution"
        if "==" in requirement:
            assert installed[name] == requirement.partition("==")[2]
    nccl = [(name, version) for name, version in installed.items() if name.startswith("nvidia-nccl")]
    assert nccl, "torch's Linux wheel should bring NCCL as an nvidia-nccl-* wheel"
    version = tuple(int(p) for p in nccl[0][1].split(".")[:3])
    problem = nccl_version_problem(version)
    assert problem is None, f"{nccl[0]}: {problem}"
    print(f"image requirements resolved in {seconds:.0f} s: torch {installed['torch']}, {nccl[0]}")


@needs_index
@pytest.mark.parametrize("requirement", ["torch==2.13.0+cu128", "nvidia-resiliency-ext==0.6.99"])
def test_resolution_gate_fails_for_a_wheel_that_does_not_exist(tmp_path, requirement):
    """The gate is live: torch 2.13 has no CUDA 12.8 build, and an impossible pin fails too."""
    result, _ = resolve_for_image([requirement], tmp_path / "report.json")
    assert result.returncode != 0
    assert "No matching distribution" in result.stderr or "ResolutionImpossible" in result.stderr


# --- the Dockerfile -----------------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    config = ROOT / ".hadolint.yaml"
    result = subprocess.run([str(VENV_BIN / "hadolint"), "--config", str(config), str(ROOT / DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # Each ignored rule carries its reason: a comment right above it.
    lines = config.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*-\s*DL\d+", line):
            assert lines[i - 1].lstrip().startswith("#"), f"{line.strip()} is ignored without a reason"


def test_dockerfile_env_carries_the_nccl_and_allocator_settings_the_pod_env_has():
    text = (ROOT / DOCKERFILE).read_text()
    env = env_of(text)
    assert {k: env.get(k) for k in TRAINER_PROCESS_ENV} == TRAINER_PROCESS_ENV
    # The build refuses an NCCL the in-process restart cannot run on (workloads.process_env).
    runs = [args for keyword, args in instructions(text) if keyword == "RUN"]
    assert any(args.startswith("python -m workloads.process_env --check-nccl") for args in runs)


def test_dockerfile_states_no_package_version_of_its_own():
    """Python versions come from pyproject's trainer extra only; the image reads them there."""
    text = (ROOT / DOCKERFILE).read_text()
    runs = " ".join(args for keyword, args in instructions(text) if keyword == "RUN")
    assert "trainer_requirements.py" in runs and "pip install --no-cache-dir ${PIP_INSTALL_FROM} -r" in runs
    assert not re.search(r"pip install[^&]*==", runs)
    assert not re.search(r"ARG (TORCH|NVRX)_", text)


def test_dockerfile_runs_the_efa_installer_before_apt_lists_are_deleted():
    runs = [args for keyword, args in instructions((ROOT / DOCKERFILE).read_text()) if keyword == "RUN"]
    (efa,) = [r for r in runs if "efa_installer.sh" in r]
    assert "apt-get update" in efa and efa.index("efa_installer.sh") < efa.index("/var/lib/apt/lists")
    assert not any("/var/lib/apt/lists" in r for r in runs[: runs.index(efa)])
    assert "VALIDSIG" in efa  # the tarball is used only with a good signature


def _stages(dockerfile: str) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """{stage name: (what it is FROM, its instructions)}, in order."""
    stages: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, args in instructions(dockerfile):
        if keyword == "FROM":
            base, _, name = args.partition(" AS ")
            current = []
            stages[name.strip()] = (base.strip(), current)
        else:
            current.append((keyword, args))
    return stages


def test_the_cpu_twin_and_the_cluster_image_share_the_trainer_layer():
    """One `trainer` stage on either base; the cluster's image (the default target, the last
    stage) is that stage plus the CUDA/EFA checks, so the twin runs the same lines."""
    text = (ROOT / DOCKERFILE).read_text()
    stages = _stages(text)
    assert list(stages) == ["cuda-efa", "cpu", "trainer", "gpu"]
    assert stages["trainer"][0] == "${TRAINER_BASE}" and "ARG TRAINER_BASE=cuda-efa" in text
    assert stages["gpu"][0] == "trainer"
    trainer = stages["trainer"][1]
    assert ("COPY", "workloads ./workloads") in trainer
    assert ("ENTRYPOINT", '["/usr/bin/tini", "--"]') in trainer
    assert any(k == "RUN" and "trainer_requirements.py" in a for k, a in trainer)
    ((keyword, checks),) = stages["gpu"][1]
    assert keyword == "RUN" and "--check-plugin" in checks and "--check-nccl" in checks


def test_dockerfile_keeps_the_efa_installer_off_its_ngc_paths():
    """An nvidia/cuda base carries NGC's entrypoint file; without both flags the installer may
    take it for an NGC image and choose its NGC plugin package (AWS's Dockerfiles pass both)."""
    runs = [args for keyword, args in instructions((ROOT / DOCKERFILE).read_text()) if keyword == "RUN"]
    (efa,) = [r for r in runs if "efa_installer.sh" in r]
    assert {"--disable-build-ngc", "--disable-ngc"} <= set(re.findall(r"--[\w-]+", efa))


def test_image_and_pods_name_the_same_nccl_net_plugin():
    assert env_of((ROOT / DOCKERFILE).read_text())["NCCL_NET_PLUGIN"] == transport.NET_PLUGIN


def _efa_layer_cudart_link() -> str:
    """The shell lines of the EFA layer that add the unversioned libcudart.so link."""
    runs = [args for keyword, args in instructions((ROOT / DOCKERFILE).read_text()) if keyword == "RUN"]
    (efa,) = [r for r in runs if "efa_installer.sh" in r]
    steps = [step.strip() for step in efa.split(" && ")]
    first = next(i for i, step in enumerate(steps) if step.startswith("cudart="))
    last = next(i for i, step in enumerate(steps) if i > first and step == "ldconfig")
    return " && ".join(steps[first : last + 1])


@pytest.mark.parametrize("has_cudart", [True, False])
def test_image_links_the_unversioned_cuda_runtime_the_plugin_opens(tmp_path, has_cudart):
    """The Dockerfile's own lines, run under bash against a stand-in loader cache: they link
    libcudart.so beside the versioned runtime the cache names, or fail the build without one."""
    lib = tmp_path / "cuda" / "targets" / "x86_64-linux" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13.0.96").write_text("")
    (lib / "libcudart.so.13").symlink_to("libcudart.so.13.0.96")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cache = f"\tlibcudart.so.13 (libc6,x86-64) => {lib / 'libcudart.so.13'}\n" if has_cudart else ""
    (bin_dir / "ldconfig").write_text(
        f'#!/bin/bash\n[ "$1" = -p ] && printf \'3 libs found in cache\\n'
        f"\\tlibz.so.1 (libc6,x86-64) => /lib/libz.so.1\\n{cache}'\nexit 0\n"
    )
    (bin_dir / "ldconfig").chmod(0o755)
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", _efa_layer_cudart_link()],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, capture_output=True, text=True,
    )  # fmt: skip
    if has_cudart:
        assert result.returncode == 0, result.stderr
        assert os.readlink(lib / "libcudart.so") == "libcudart.so.13"
    else:
        assert result.returncode != 0 and not (lib / "libcudart.so").exists()


def test_dockerfile_puts_the_nccl_plugin_where_nccl_looks_and_asserts_it():
    steps = instructions((ROOT / DOCKERFILE).read_text())
    library_path = env_of((ROOT / DOCKERFILE).read_text())["LD_LIBRARY_PATH"].split(":")
    # EFA installer 1.48 puts the plugin in lib, older Ubuntu builds in lib/x86_64-linux-gnu.
    assert {"/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"} <= set(library_path)
    copy_workloads = next(i for i, (k, a) in enumerate(steps) if k == "COPY" and "workloads" in a)
    checks = [i for i, (k, a) in enumerate(steps) if k == "RUN" and "workloads.transport --check-plugin" in a]
    assert checks and checks[0] > copy_workloads


def test_image_entrypoint_is_tini_without_process_group_signalling():
    (entrypoint,) = [args for keyword, args in instructions((ROOT / DOCKERFILE).read_text()) if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["/usr/bin/tini", "--"]


# --- shell scripts --------------------------------------------------------------------------


def _pod(job: dict) -> dict:
    if job["kind"] == "PyTorchJob":
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    return job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def test_setup_script_passes_shellcheck():
    assert_shellcheck_clean((ROOT / "scripts" / "setup_env.sh").read_text(), shell="bash", name="setup_env.sh")


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
def test_rendered_trainer_entrypoint_passes_shellcheck(api):
    job = render_job(build_jobspec(resolve_config("p5"), nodes=2, name="train", api=api)).job_document
    shell, flag, script = _pod(job)["spec"]["containers"][0]["args"]
    assert (shell, flag) == ("/bin/sh", "-c")
    assert_shellcheck_clean(script, shell="sh", name=f"{api} trainer entrypoint")


@pytest.mark.parametrize("nodes", [1, 4])
def test_rendered_fabric_test_passes_shellcheck(nodes):
    job = render_job(build_jobspec(resolve_config("p5"), nodes=nodes, name="nccl", workload="nccl-test")).job_document
    shell, flag, script = _pod(job)["spec"]["containers"][0]["command"]
    assert (shell, flag) == ("/bin/bash", "-c")
    assert_shellcheck_clean(script, shell="bash", name=f"fabric test ({nodes} nodes)")
