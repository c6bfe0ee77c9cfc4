"""The upstream CRD files the validator's CRD layer checks JobSets and PyTorchJobs against,
pinned by release tag and sha256, and where they come from on this machine.

- `NVRX_EKS_CRD_DIR` set: that folder holds the files (a shared copy, an air-gapped mirror, the
  tests' ../shared/crds); it is read, never written or fetched into.
- Otherwise a per-user cache, `$XDG_CACHE_HOME/nvrx-eks/crds` (default `~/.cache/nvrx-eks/crds`),
  filled on first use from the raw files at the release tags on GitHub.
Every file is checked against its pinned sha256 before it is used, so neither a moved tag nor a
damaged download can change what "valid" means. When a file cannot be had (offline, mismatch),
the CRD layer is skipped with a message saying why and how to fix it; the other layers still run.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from infra.addons.catalog import JOBSET as JOBSET_ADDON
from infra.addons.catalog import TRAINING_OPERATOR
from nvrx_eks.facts.job_kinds import JOBSET, PYTORCHJOB, JobKind

CRD_DIR_ENV = "NVRX_EKS_CRD_DIR"
#: Seconds to wait for GitHub before declaring this machine offline.
FETCH_TIMEOUT_S = 15


@dataclass(frozen=True)
class PinnedCrd:
    file_name: str
    url: str
    sha256: str


def _pinned(kind: JobKind, release: str, url_dir: str, sha256: str) -> PinnedCrd:
    """The CRD of `kind` at a release tag; upstream names the file <group>_<plural>.yaml."""
    file = f"{kind.group}_{kind.plural}.yaml"
    return PinnedCrd(file.replace(".yaml", f".{release}.yaml"), f"{url_dir}/{file}", sha256)


#: The CRDs at the versions the cluster stack installs (the add-on records); a new pin needs its
#: file's sha256 here, or the download check fails and says so.
PINNED_CRDS = (
    _pinned(
        JOBSET,
        f"v{JOBSET_ADDON.version}",
        f"https://raw.githubusercontent.com/kubernetes-sigs/jobset/v{JOBSET_ADDON.version}/config/components/crd/bases",
        "d022b87624512cf0b6741b31b24a2bea9945b5a838b50713af29332c878bb6fe",
    ),
    _pinned(
        PYTORCHJOB,
        TRAINING_OPERATOR.version,
        f"https://raw.githubusercontent.com/kubeflow/trainer/{TRAINING_OPERATOR.version}/manifests/base/crds",
        "8b8a8a719cc94173169290251e817f7ac2bb425c20b6c2fa813397bcf4e932ed",
    ),
)


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nvrx-eks" / "crds"


@dataclass(frozen=True)
class CrdFiles:
    """The verified files, or why there are none (`skipped`, a message for the user)."""

    paths: tuple[Path, ...] = ()
    skipped: str | None = None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _verified(path: Path, crd: PinnedCrd) -> bool:
    try:
        return _sha256(path.read_bytes()) == crd.sha256
    except OSError:
        return False


def _fetch(crd: PinnedCrd, directory: Path) -> str | None:
    """Download one file into the cache; None on success, else the reason."""
    try:
        with urllib.request.urlopen(crd.url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as e:
        return f"could not download {crd.url} ({getattr(e, 'reason', e)})"
    if _sha256(data) != crd.sha256:
        return f"{crd.url} does not match its pinned sha256 (the tag moved, or the download was altered)"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f".{crd.file_name}.partial"
        partial.write_bytes(data)
        partial.replace(directory / crd.file_name)  # atomic: a reader never sees half a file
    except OSError as e:
        return f"could not write the cache {directory} ({e.strerror})"
    return None


def crd_files() -> CrdFiles:
    configured = os.environ.get(CRD_DIR_ENV)
    if configured:
        directory = Path(configured)
        bad = [c.file_name for c in PINNED_CRDS if not _verified(directory / c.file_name, c)]
        if bad:
            return CrdFiles(
                skipped=f"CRD schema layer skipped: {', '.join(bad)} missing from {directory} ({CRD_DIR_ENV}) or "
                "not the pinned upstream file; put the files there, or unset it to fetch them into the user cache"
            )
        return CrdFiles(tuple(directory / c.file_name for c in PINNED_CRDS))

    directory = user_cache_dir()
    for crd in PINNED_CRDS:
        if _verified(directory / crd.file_name, crd):
            continue
        problem = _fetch(crd, directory)
        if problem:
            return CrdFiles(
                skipped=f"CRD schema layer skipped: {problem}; run again with network access to cache the pinned "
                f"CRDs in {directory}, or set {CRD_DIR_ENV} to a folder holding them"
            )
    return CrdFiles(tuple(directory / c.file_name for c in PINNED_CRDS))
