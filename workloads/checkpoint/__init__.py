"""Checkpoints: DCP format, written by NVRx async checkpointing (or torch's async_save, or
synchronously), committed atomically, verified and restored.

Layout and commit rules: nvrx_eks.facts.checkpoint_layout.

A checkpoint counts only once it is listed in latest.json, which rank 0 replaces atomically
(write, fsync, rename) after writing the directory's commit.json, which itself is written only
after the global finalize saw every rank's data on disk. A rank killed mid-save therefore leaves a
directory that nothing ever loads. (Without a usable latest.json the list is rebuilt from the
commit records that verify, with a warning; a readable pointer that a newer verified commit
proves stale gives way to it, with a warning.) Each save goes to a fresh directory (the attempt token differs
per restart), so an abandoned save is never overwritten in place, and nothing is deleted before a
newer checkpoint committed: at each commit rank 0 keeps the newest `keep` committed checkpoints and
removes what the pointer it read proves superseded (older commits, abandoned saves, and commits
from a timeline that a fallback abandoned, i.e. at or after the new step; see
checkpoint_layout.may_delete).

commit.json records every file's size and, with checkpoint.verify=sha256, its SHA-256 (each rank's
files are hashed by whoever wrote them: for the async backends the writer does it right after
writing, in the NVRx worker process or torch's writer thread, so the commit on the training thread
only gathers the digests instead of reading the rank's whole shard back; sync saves hash at the
commit). Loading re-checks them (each rank the files it reads, except those this same process
committed and nobody touched since, which are re-hashed in the background and refuse the next
commit if damaged: see Checkpointer._verify_share) and refuses, with a
ConfigError, a checkpoint from another world size or model preset; a checkpoint that fails the
check or fails to load is skipped with a warning and the previous committed one is used.

A save the storage refuses (read-only, not permitted, full: CheckpointStorageError) ends the run
with the cause named rather than costing restarts that meet the same storage; its directory is
removed if it provably never committed.

Backends (checkpoint.backend): one writer class each (writers). At most one save is in flight: a
new save first waits for the previous commit.

Modules: checkpointer (the Checkpointer: save policy, commit, load), writers (one class per
backend), nvrx_worker (the NVRx worker process across in-process restarts), train_state (the
training progress and RNG as stateful objects), local_tier (the node-local tier), copy_format
(the node-local copies' file format), files (file
digests and the commit-time trust), digest (the state's SHA-256), errors (what a save or a load
can fail with).
"""
