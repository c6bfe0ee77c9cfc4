"""The smoke's checks before any launch: the preset must fit the GPU (workloads.memory's fit check),
the disk where the runs go must hold the checkpoints the smoke keeps at once, and /dev/shm the
state NVRx's async save stages there. Each refusal is one line naming the fix, exit 2."""

from __future__ import annotations

import shutil

import pytest

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_CONFIG_ERROR
from nvrx_eks.facts.instances import PEAK_BF16_DENSE_TFLOPS
from nvrx_eks.ops import gpu_smoke
from nvrx_eks.ops.gpu_smoke import Room, SmokePlan, check_fit, check_room, gpu_plan, plan_for, room_needed
from workloads.memory import CHECKPOINT_BYTES_PER_PARAM, GIB, parameter_count
from workloads.presets import MODEL_PRESETS

#: torch.cuda.get_device_properties(0).total_memory of an H200 (143771 MiB, as nvidia-smi shows it).
H200_BYTES = 143771 << 20


def _gpu_plan(preset: str, nproc: int = 1) -> SmokePlan:
    return gpu_plan(8, "NVIDIA H200", preset, nproc)


def test_a_preset_that_does_not_fit_one_gpu_is_refused_with_the_fix(tmp_path):
    plan = _gpu_plan("8b")
    with pytest.raises(ConfigError) as refused:
        check_fit(plan, plan.train_config(tmp_path / "faulted"), "NVIDIA H200", H200_BYTES)
    message = str(refused.value)
    assert message.startswith("--preset 8b: ") and "exceeds the 140.4 GiB of one NVIDIA H200" in message
    assert "smaller --preset" in message and "--nproc" in message and "\n" not in message


def test_the_default_gpu_preset_fits_one_h200(tmp_path):
    plan = _gpu_plan("1b")
    check_fit(plan, plan.train_config(tmp_path / "faulted"), "NVIDIA H200", H200_BYTES)


def test_the_disk_must_hold_keep_plus_two_checkpoints_of_the_whole_job(tmp_path):
    plan = _gpu_plan("1b", nproc=8)
    train = plan.train_config(tmp_path / "faulted")
    room = room_needed(plan, train)
    whole_job = parameter_count(MODEL_PRESETS["1b"]) * CHECKPOINT_BYTES_PER_PARAM
    # Rounded per rank by the estimate: within one byte per rank of the whole job's state.
    assert abs(room.checkpoint_bytes - whole_job) <= plan.nproc
    # keep 2 committed + one being written + one a fault orphaned; the sync run's two saves beside
    # the faulted run's two committed ones hold no more.
    assert train.checkpoint.keep == 2 and room.checkpoints == 4
    assert room.disk_bytes == 4 * room.checkpoint_bytes
    assert room.shm_bytes == int(gpu_smoke.SHM_HEADROOM * room.checkpoint_bytes)
    # The 1b smoke needs about 49 GiB of disk: most of a 64 GiB machine's.
    assert 45 * GIB < room.disk_bytes < 55 * GIB


def test_too_little_disk_where_the_runs_go_is_refused_before_anything_is_written(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    room = Room(disk_bytes=free + 10 * GIB, shm_bytes=0, checkpoint_bytes=(free + 10 * GIB) // 4, checkpoints=4)
    runs = tmp_path / "not" / "yet" / "there"
    with pytest.raises(ConfigError) as refused:
        check_room(room, runs)
    message = str(refused.value)
    assert message.startswith(f"--out: {tmp_path} has ") and "4 of" in message and "more room" in message
    assert not (tmp_path / "not").exists()


def test_too_small_a_dev_shm_is_refused_with_the_remount(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    staged = shutil.disk_usage(shm).free
    room = Room(disk_bytes=0, shm_bytes=int(staged * 1.2) + GIB, checkpoint_bytes=staged, checkpoints=4)
    with pytest.raises(ConfigError, match=rf"^{shm}: .* GiB free; NVRx's async save stages .*mount -o remount"):
        check_room(room, tmp_path, shm_dir=shm)


def test_the_dry_runs_room_fits_here(tmp_path):
    plan = plan_for(True, None, None)
    check_room(room_needed(plan, plan.train_config(tmp_path / "faulted")), tmp_path)


def test_the_command_refuses_a_plan_without_room_in_one_line_and_exit_2_before_any_launch(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(gpu_smoke, "SHM_HEADROOM", 1e15)

    def no_launch(*args, **kwargs):
        raise AssertionError("a launch started although the plan was refused")

    monkeypatch.setattr(gpu_smoke, "_run", no_launch)
    code = gpu_smoke.main(["--dry-run", "--out", str(tmp_path / "smoke")])
    printed = capsys.readouterr().out
    assert code == EXIT_CONFIG_ERROR
    assert printed.startswith("error: /dev/shm: ") and printed.count("\n") == 1 and "Traceback" not in printed
    assert not (tmp_path / "smoke").exists()


def test_every_smoke_run_turns_tensorboard_off_and_the_gpu_runs_add_nccl(tmp_path):
    assert "metrics.tensorboard=false" in plan_for(True, None, None).overrides
    train = _gpu_plan("1b").train_config(tmp_path / "faulted")
    assert train.metrics.tensorboard is False and train.distributed.backend == "nccl"


def test_a_preset_shorter_than_the_gpu_sequence_runs_at_its_longest(tmp_path):
    """The small preset's max_seq_len is 1024: at the 1b preset's 2048 its configuration is invalid."""
    plan = _gpu_plan("small")
    assert plan.seq_len == MODEL_PRESETS["small"].max_seq_len < gpu_smoke.GPU_SEQ_LEN
    assert plan.train_config(tmp_path / "faulted").data.seq_len == plan.seq_len
    assert _gpu_plan("1b").seq_len == gpu_smoke.GPU_SEQ_LEN


def test_the_plan_reads_mfus_peak_from_the_device_name():
    assert gpu_plan(1, "NVIDIA H200", None, None).peak_tflops == PEAK_BF16_DENSE_TFLOPS["H200"]
    assert gpu_plan(1, "NVIDIA L4", None, None).peak_tflops is None
    assert "peak_tflops_per_gpu=989.0" in gpu_plan(1, "NVIDIA H100 80GB HBM3", None, None).overrides
    with pytest.raises(ConfigError, match="^--nproc: 2 ranks need 2 GPUs; this machine has 1$"):
        gpu_plan(1, "NVIDIA H200", None, 2)
