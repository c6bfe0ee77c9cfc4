"""What a checkpoint directory holds and how its commit state is read: the names, stated once, and
the rules that decide which checkpoints count. No torch: the launcher command, the pod preflight
and the CLI read it as well as the trainer.

Layout under checkpoint.dir:
    step_00000040-<attempt>/      one save: DCP shards (`__<rank>_<n>.distcp`) and `.metadata`
        commit.json               written by rank 0 only after every rank finished writing
        .digests-rank<R>.json     rank R's file digests from its async writer, until the commit
    latest.json                   the run-level pointer: {"latest", "step", "committed": [...]}
    latest_step                   the newest committed step as a bare integer (ft_launcher's
                                  progress tracker reads it)

The pointer is the record of what is committed; a directory's commit.json is the evidence. When
the pointer is missing or unreadable while commit records exist (an operator deleted it, a bad
copy truncated it), the committed list is rebuilt from the commit records that verify, and the
caller is told so: the alternative, "no pointer = nothing committed", restarts at step 0 and the
next commit's retention would delete every committed checkpoint. A readable pointer that is stale
(a verified commit newer than everything it names exists: the pointer was put back from an older
copy, or rank 0 died between a commit record and the pointer) gives way to the newer commits, and
the caller is told so: trusting it would roll the run back silently, and retention, which deletes
only what a pointer proves superseded, would never remove the newer directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POINTER_FILE = "latest.json"
ITERATION_FILE = "latest_step"
COMMIT_FILE = "commit.json"
METADATA_FILE = ".metadata"
#: Left by an async writer beside a rank's shards until the commit gathers it:
#: {file name: [size, sha256 or null]}.
DIGESTS_FILE = ".digests-rank{rank}.json"
_NAME = re.compile(r"^step_(\d{8})-([0-9a-z.]+)$")


def step_dir_name(step: int, token: str) -> str:
    return f"step_{step:08d}-{token}"


def step_of(name: str) -> int:
    match = _NAME.match(name)
    return int(match.group(1)) if match else -1


def iteration_file(ckpt_dir: str | Path) -> str:
    """The file ft_launcher's progress tracker reads (`--ft-checkpoint-iteration-file`)."""
    return f"{ckpt_dir}/{ITERATION_FILE}"


def checkpoint_dirs(ckpt_dir: str | Path) -> list[Path]:
    root = Path(ckpt_dir)
    return sorted(p for p in root.iterdir() if _NAME.match(p.name)) if root.is_dir() else []


#: What a checkpoint records about the run that wrote it, with the setting an operator changes.
IDENTITY_FIELDS = {
    "world_size": "world size (nnodes x nproc-per-node)",
    "preset": "model.preset",
    "model_shape": "model shape (the model.* fields set over the preset, e.g. model.vocab_size)",
    "shard": "distributed.shard",
    "nproc_per_node": "ranks per node (nproc-per-node)",
}
#: What an identity field is in a record written before the field existed: a checkpoint from
#: before custom shapes holds the preset's shape exactly.
_RECORDED_BEFORE: dict[str, Any] = {"model_shape": {}}
#: Identity fields of how the state is laid out across ranks, not of what it is: DCP reshards the
#: shards in checkpoint.dir onto another layout on load (the data position and the RNG keys do not
#: depend on it), so a resume may change them. A node-local copy is one rank's shard as is: a
#: copy of another layout is skipped for the FSx checkpoint, never loaded.
LAYOUT_FIELDS = ("world_size", "shard", "nproc_per_node")

#: The fix for a checkpoint another run wrote when the operator means to start over.
START_OVER = "point checkpoint.dir at an empty directory to start a new run"


def run_identity(world_size: int, preset: str, model_shape: dict[str, Any] | None = None) -> dict[str, Any]:
    """The commit record's identity fields for this run: a checkpoint loads only into the same.
    `model_shape`: the shape fields set over the preset that differ from it (ModelConfig.shape_changes);
    with the preset they are the model, which is also how an export learns its shape."""
    return {"world_size": world_size, "preset": preset, "model_shape": dict(model_shape or {})}


def recorded_model_shape(manifest: dict[str, Any]) -> Any:
    """The shape fields over the preset that a commit record holds ({} in a record from before);
    as read, unchecked."""
    return manifest.get("model_shape", _RECORDED_BEFORE["model_shape"])


def local_copy_identity(
    world_size: int, preset: str, shard: str, nproc_per_node: int, model_shape: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The identity every node-local copy records (workloads.checkpoint.local_tier): the run's,
    plus what decides a copy's contents and place. A copy is one rank's own FSDP shard as is, laid
    out by distributed.shard, and its replica is held by the rank nproc-per-node further on. DCP
    shards in checkpoint.dir are resharded on load, so the commit record leaves these two out."""
    return {**run_identity(world_size, preset, model_shape), "shard": shard, "nproc_per_node": nproc_per_node}


def incompatibility(
    manifest: dict[str, Any], identity: dict[str, Any], start_over: str = START_OVER, *, layout_may_differ: bool = False
) -> str | None:
    """Why a checkpoint whose record is `manifest` cannot be resumed by a run of `identity`, or
    None. `layout_may_differ`: the LAYOUT_FIELDS are not compared (a checkpoint DCP reshards)."""
    for key, expected in identity.items():
        if layout_may_differ and key in LAYOUT_FIELDS:
            continue
        recorded = manifest.get(key, _RECORDED_BEFORE.get(key))
        if recorded != expected:
            return (
                f"was written with {key}={recorded!r}, this run has {key}={expected!r}; resume "
                f"with the same {IDENTITY_FIELDS.get(key, key)} or {start_over}"
            )
    return None


class PointerUnreadable(ValueError):
    """latest.json exists but is not a pointer (truncated, not JSON, wrong shape)."""


def read_pointer(ckpt_dir: str | Path) -> dict[str, Any] | None:
    """The pointer, or None when there is none. Raises PointerUnreadable naming the file."""
    path = Path(ckpt_dir) / POINTER_FILE
    try:
        pointer = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise PointerUnreadable(f"{path}: {err!s:.200}") from None
    committed = pointer.get("committed") if isinstance(pointer, dict) else None
    if not (
        isinstance(committed, list)
        and all(isinstance(n, str) for n in committed)
        and isinstance(pointer.get("latest"), str)
        and isinstance(pointer.get("step"), int)
    ):
        raise PointerUnreadable(f"{path}: not a checkpoint pointer (expected latest, step, committed)")
    return pointer


def verified_commit(directory: Path) -> dict[str, Any] | None:
    """The commit record of `directory` if it is one this layout wrote and every file it lists is
    present with its recorded size (contents are checked again when loading); None otherwise."""
    try:
        manifest = json.loads((directory / COMMIT_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict):
        return None
    files = manifest.get("files")
    if manifest.get("step") != step_of(directory.name) or not isinstance(files, dict):
        return None
    for name, recorded in files.items():
        try:
            if (directory / name).stat().st_size != recorded[0]:
                return None
        except (OSError, TypeError, IndexError):
            return None
    return manifest


def scan_commits(ckpt_dir: str | Path) -> list[str]:
    """Names of the directories whose commit record verifies, newest step first."""
    found = [p for p in checkpoint_dirs(ckpt_dir) if verified_commit(p) is not None]
    return [p.name for p in sorted(found, key=lambda p: (step_of(p.name), p.name), reverse=True)]


@dataclass
class CommitState:
    """What is committed, and how that was learnt.

    source: "pointer" (latest.json read), "stale" (latest.json read, but newer verified commits
    exist: `committed` and `pointer` put them first, `warning` names them), "none" (no pointer, no
    commit record: a fresh start), "rebuilt" (no usable pointer; `committed` comes from the
    verified commit records and `warning` says why), "lost" (the pointer is unreadable and no
    commit record verifies: nothing can be resumed, and starting over silently would hide that).
    """

    committed: list[str]
    source: str
    pointer: dict[str, Any] | None = None
    warning: str | None = None

    @property
    def pointer_was_read(self) -> bool:
        return self.source in ("pointer", "stale")


def commits_newer_than(ckpt_dir: str | Path, pointer: dict[str, Any]) -> list[str]:
    """Verified commits the pointer does not name, at a later step than it names and committed
    after every commit it names that verifies; newest first. A commit the pointer does not name
    and that is older than its newest commit belongs to a timeline a fallback abandoned (its
    directory is removed by the next commit's retention) and stays out."""
    root = Path(ckpt_dir)
    named = {*pointer["committed"], pointer["latest"]}
    later = [p for p in checkpoint_dirs(root) if p.name not in named and step_of(p.name) > pointer["step"]]
    if not later:
        return []
    named_times = [
        manifest.get("committed_at") for name in named if (manifest := verified_commit(root / name)) is not None
    ]
    since = max((t for t in named_times if isinstance(t, (int, float))), default=None)
    if since is None:  # nothing the pointer names verifies: the load reports that instead
        return []
    newer = [
        p
        for p in later
        if (manifest := verified_commit(p)) is not None
        and isinstance(manifest.get("committed_at"), (int, float))
        and manifest["committed_at"] > since
    ]
    return [p.name for p in sorted(newer, key=lambda p: (step_of(p.name), p.name), reverse=True)]


def commit_state(ckpt_dir: str | Path, keep: int | None = None) -> CommitState:
    try:
        pointer = read_pointer(ckpt_dir)
        problem = None if pointer is not None else f"{Path(ckpt_dir) / POINTER_FILE} is missing"
    except PointerUnreadable as err:
        pointer, problem = None, f"{err}"
    if pointer is not None:
        newer = commits_newer_than(ckpt_dir, pointer)
        if not newer:
            return CommitState(list(pointer["committed"]), "pointer", pointer)
        committed = newer + [n for n in pointer["committed"] if n not in newer]
        return CommitState(
            committed,
            "stale",
            {"latest": committed[0], "step": step_of(committed[0]), "committed": committed},
            warning=(
                f"{Path(ckpt_dir) / POINTER_FILE} names step {pointer['step']} but {newer[0]} has a "
                f"newer verified commit; resuming from it, the newest (was the pointer put back from "
                "an older copy?)"
            ),
        )
    found = scan_commits(ckpt_dir)
    if found:
        committed = found[:keep] if keep else found
        return CommitState(
            committed,
            "rebuilt",
            warning=(
                f"{problem}; rebuilt it from the commit records of {len(found)} committed "
                f"checkpoint(s), newest {committed[0]}"
            ),
        )
    if Path(ckpt_dir, POINTER_FILE).exists():
        return CommitState(
            [],
            "lost",
            warning=(
                f"checkpoint.dir: {problem}, and no {COMMIT_FILE} under {ckpt_dir} verifies; restore "
                f"the checkpoints, or remove {POINTER_FILE} to start the run over"
            ),
        )
    return CommitState([], "none")


def pointer_text(committed: list[str]) -> str:
    return json.dumps({"latest": committed[0], "step": step_of(committed[0]), "committed": committed}, indent=1)


def may_delete(directory: Path, state: CommitState, keep: list[str]) -> bool:
    """Retention's rule for a directory not kept by the commit that just happened.

    Deleted only from knowledge: a directory with no commit record that the pointer does not
    name is an abandoned save (provably uncommitted); a directory with a commit record goes only
    when the pointer read before this commit listed it (a retention or fallback decision made on
    the record) or names a newer committed checkpoint. A rebuilt or missing pointer proves
    neither, so nothing committed is deleted until a commit is made on a pointer that was read.
    """
    name = directory.name
    if name in keep:
        return False
    pointer = state.pointer if state.pointer_was_read else None
    named = pointer is not None and (name in pointer["committed"] or name == pointer["latest"])
    if not (directory / COMMIT_FILE).exists():
        return not named
    return pointer is not None and (named or pointer["step"] > step_of(name))


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        # A full or read-only file system: leave no temporary file behind to mislead a reader.
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ----- storage that refuses a checkpoint ---------------------------------------------------------


def mount_point(path: Path) -> Path:
    """The mount `path` lives on: the longest mount point above it in /proc/self/mounts (a bind
    mount shares its device with its parent, so comparing devices would name the parent)."""
    path = Path(path).resolve()
    try:
        mounts = [
            Path(line.split()[1].replace("\\040", " ")) for line in Path("/proc/self/mounts").read_text().splitlines()
        ]
    except OSError:
        mounts = []
    above = [m for m in mounts if path == m or m in path.parents]
    if above:
        return max(above, key=lambda m: len(m.parts))
    while not os.path.ismount(path):
        path = path.parent
    return path


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def storage_refusal_now(ckpt_dir: str | Path, need_bytes: int) -> str | None:
    """ "read-only", "denied" or "full" when checkpoint.dir (or the directory it will be created
    in) cannot take a checkpoint of need_bytes now; None when it can."""
    target = Path(ckpt_dir)
    while not target.exists():
        target = target.parent
    if os.statvfs(target).f_flag & os.ST_RDONLY:
        return "read-only"
    if not os.access(target, os.W_OK | os.X_OK):
        return "denied"
    if shutil.disk_usage(target).free < need_bytes:
        return "full"
    return None


def storage_refusal_message(kind: str, ckpt_dir: str | Path, need_bytes: int, err: OSError | None = None) -> str:
    """The one line that names why checkpoint.dir refuses a checkpoint, and the fix."""
    mount = mount_point(Path(ckpt_dir))
    if kind == "read-only":
        return (
            f"checkpoint.dir {ckpt_dir} is read-only (file system at {mount}); mount it "
            "read-write or point checkpoint.dir at writable storage"
        )
    if kind == "denied":
        why = f": {err.strerror}" if err is not None and err.strerror else ""
        return (
            f"checkpoint.dir {ckpt_dir} is not writable by this process (uid {os.getuid()})"
            f"{why}; fix its ownership or permissions, or point checkpoint.dir elsewhere"
        )
    free = shutil.disk_usage(mount).free
    return (
        f"no space left on {mount} ({human_bytes(free)} free): a checkpoint needs "
        f"~{human_bytes(need_bytes)}; free space there, enlarge the file system, or lower "
        "checkpoint.keep"
    )


def committed_bytes(directory: Path) -> int:
    """Bytes of one committed checkpoint, from its commit record (0 if it has none)."""
    manifest = verified_commit(directory)
    return sum(int(v[0]) for v in manifest["files"].values()) if manifest else 0
