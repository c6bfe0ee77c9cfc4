"""A trained tiny run out to Hugging Face and back: transformers computes our model's logits from
the export, the export loads into a sharded model and exports again bit for bit, and a run
started from it (`model.init_from`) begins where the exporting run ended; an own-shaped model
(`model.shape_from`) trains and exports with its shape."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nvrx_eks.facts.checkpoint_layout import commit_state
from tests.support.cli_harness import run_cli
from tests.support.hf_checkpoints import commit, our_model, step_dir
from tests.support.named_runs import RUNS, named_run
from tests.support.trainer_fixtures import exclusive_trainer_runs, local_run, port_pair, single_rank_env
from workloads.events import load_run
from workloads.process_exit import exit_without_finalizing

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]

#: fp32 logits of transformers' eager Llama against ours (SDPA): the same arithmetic in another
#: order; measured differences are ~1e-6.
ATOL = RTOL = 2e-5
STEPS = RUNS["hf-export"].steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return named_run(tmp_path_factory, "hf-export")


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "tiny-hf"
    result = run_cli("export", str(trained), "--format", "hf", "--out", str(out))
    assert result.code == 0, result.output
    assert f"exported step {STEPS}" in result.stdout and "tokenizer byte" in result.stdout
    return out


def test_transformers_computes_our_logits_from_the_export(trained, exported):
    from transformers import AutoTokenizer, LlamaForCausalLM

    newest = trained / "checkpoints" / commit_state(trained / "checkpoints").committed[0]
    ours = our_model(newest, "tiny")
    theirs = LlamaForCausalLM.from_pretrained(exported, dtype=torch.float32, attn_implementation="eager").eval()
    assert theirs.config.num_key_value_heads < theirs.config.num_attention_heads  # the tiny preset is GQA
    tokens = torch.tensor(AutoTokenizer.from_pretrained(exported)(["the same tokens, twice over"] * 2).input_ids)
    tokens[1] = tokens[1].flip(0)
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens), atol=ATOL, rtol=RTOL)


def _import_and_save(rank: int, world: int, port: int, source: str, run: str) -> None:
    """One rank: the tiny model sharded over `world` ranks (rows split across heads at 3 ranks),
    loaded from `source`, saved as a committed checkpoint of `run` the way the trainer saves."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from workloads.device import Runtime
    from workloads.hf_import import load_hf_weights
    from workloads.model import build_model
    from workloads.presets import MODEL_PRESETS

    runtime = Runtime(device=torch.device("cpu"), backend="gloo", bf16=False, pg_timeout_s=60)
    mesh = init_device_mesh("cpu", (world,))
    model = build_model(MODEL_PRESETS["tiny"], runtime, mesh, seed=99, checkpointed_blocks=2)
    load_hf_weights(model, source, "the tiny preset", None)
    path = step_dir(Path(run), 7)
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(path))
    dist.barrier()
    if rank == 0:
        commit(path, preset="tiny", world_size=world)
    dist.destroy_process_group()
    exit_without_finalizing(0)


def test_importing_the_export_then_exporting_again_is_bit_identical(exported, tmp_path):
    world = 3
    mp.start_processes(_import_and_save, args=(world, port_pair(), str(exported), str(tmp_path / "run")), nprocs=world)
    result = run_cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "again"))
    assert result.code == 0, result.output
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == (exported / name).read_bytes(), name


def test_a_run_from_the_export_starts_where_the_exporting_run_ended(trained, exported, tmp_path, tmp_path_factory):
    """Step 1 of the new run trains the exported weights on the synthetic stream's first batch,
    a batch the exporting run saw STEPS steps ago: not equal to its last loss (another batch,
    weights one update older), but as low, and far below the random initialization's loss on
    that same batch, which is the exporting run's own step 1 (same seed, same data)."""
    with exclusive_trainer_runs(tmp_path_factory):
        local_run(tmp_path / "run", steps=5, interval=5, backend="sync", overrides=(f"model.init_from={exported}",))
    exporting = {e["step"]: e["loss"] for e in load_run(trained).of("step_end", rank=0)}
    started = {e["step"]: e["loss"] for e in load_run(tmp_path / "run").of("step_end", rank=0)}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final_step"] == 5
    assert started[1] < exporting[1] - 1.0, (started[1], exporting)
    assert abs(started[1] - exporting[STEPS]) < 0.25, (started[1], exporting[STEPS])


def test_a_model_of_its_own_shape_goes_in_and_comes_out_with_that_shape(exported, tmp_path, monkeypatch):
    """An own-shaped Hugging Face model (the exported tiny run, deeper and with a larger vocabulary
    than the preset: config.json and tensors rewritten) trains with `model.shape_from` +
    `model.init_from`, and its export states the same shape and loads in transformers. The shape
    is what is checked, so the run is one rank in this process (a local run's config without the
    in-process wrapper); a sharded load over several ranks is the import test's."""
    from safetensors.torch import load_file, save_file
    from transformers import LlamaForCausalLM

    from nvrx_eks.local.runner import local_config
    from workloads.process_state import ProcessState
    from workloads.train import train_attempt

    source = tmp_path / "own-hf"
    source.mkdir()
    config = json.loads((exported / "config.json").read_text())
    config.update(vocab_size=320, num_hidden_layers=3)
    (source / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(exported / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = torch.cat([tensors[name], torch.zeros(64, tensors[name].shape[1])])
    tensors |= {k.replace("layers.1.", "layers.2."): v.clone() for k, v in tensors.items() if ".layers.1." in k}
    save_file(tensors, str(source / "model.safetensors"))
    run_dir = tmp_path / "run"
    cfg = local_config(
        run_dir=run_dir,
        steps=3,
        faults="",
        preset="tiny",
        checkpoint_interval=3,
        backend="sync",
        overrides=(f"model.shape_from={source}", f"model.init_from={source}", "inprocess.enabled=false"),
    )
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(cfg.to_yaml())  # as `nvrx-eks local` writes it, for the export
    single_rank_env(monkeypatch)
    assert train_attempt(ProcessState(cfg, 0, 1, None)) == {"status": "completed"}
    assert json.loads((run_dir / "summary.json").read_text())["final_step"] == 3
    result = run_cli("export", str(run_dir), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.output
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (out["vocab_size"], out["num_hidden_layers"], out["hidden_size"]) == (320, 3, config["hidden_size"])
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert loaded.model.embed_tokens.weight.shape == (320, config["hidden_size"])
