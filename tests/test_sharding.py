"""Sharded data parallelism (fsdp:N), tensor parallelism (tp:N) and both (fsdp:A+tp:B): the blocks and projections
found, the rules, and (slow) the same losses as single with the state per device falling as 1/N."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import gpubench.backends  # noqa: F401 - registers the backends, JAX's mesh among them (options.MESH_FRAMEWORKS)
from gpubench.config import Config
from gpubench.options import parse_parallelism
from tests.conftest import REPO, plain_env, result_lines, run_cli

CORPUS = REPO / "tests" / "corpus"


def test_sharded_configs_count_their_devices_and_batches():
    fsdp = Config(workload="gpt", batch_size=8, parallelism="fsdp:4")
    assert (fsdp.devices, fsdp.replicas, fsdp.samples_per_step, fsdp.distributed) == (4, 4, 32, True)
    tp = Config(workload="gpt", batch_size=8, parallelism="tp:2")  # every rank sees the whole batch
    assert (tp.devices, tp.replicas, tp.samples_per_step, tp.micro_batch_size, tp.distributed) == (2, 1, 8, 8, True)
    jax = Config(workload="gpt", framework="jax", batch_size=8, parallelism="fsdp:2")  # one process over a mesh
    assert (jax.devices, jax.samples_per_step, jax.distributed) == (2, 16, False)
    assert Config(workload="gpt", device="cuda", parallelism="tp:2").local_cuda_ordinals == (0, 1)
    # 2-D: three replicas, each a tensor-parallel pair; on two nodes, six replicas (tp within a node)
    two_d = Config(workload="gpt", batch_size=8, parallelism="fsdp:3+tp:2")
    assert (two_d.devices, two_d.replicas, two_d.tensor_parallel, two_d.samples_per_step) == (6, 3, 2, 24)
    assert two_d.config_id == "gpt-torch-cpu-bs8-fp32-fsdp3+tp2"
    assert Config(workload="gpt", batch_size=8, parallelism="fsdp:3+tp:2", nnodes=2).replicas == 6
    assert Config(workload="gpt", parallelism="tp:2", nnodes=2).replicas == 1  # tp:N spans the nodes
    assert Config(workload="gpt", parallelism="fsdp:2+tp:2", fsdp_reshard="after-backward").config_id.endswith(
        "fsdp2+tp2-fsdp_reshard=after-backward")
    for bad, says in (("tp:2+fsdp:2", "kinds combine only as fsdp:A+tp:B"), ("fsdp:2+", "unknown parallelism"),
                      ("fsdp:32+tp:16", "A x B = 512 ranks on a node; at most 256")):
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_parallelism(bad)
    assert Config(workload="gpt", parallelism="fsdp:2", fsdp_reshard="after-backward").config_id == (
        "gpt-torch-cpu-bs64-fp32-fsdp2-fsdp_reshard=after-backward")
    assert Config(workload="gpt", parallelism="ddp:2", fsdp_reshard="after-backward").config_id == (
        "gpt-torch-cpu-bs64-fp32-ddp2")  # not used: not named


@pytest.mark.parametrize("settings, framework, reason", [
    ({"parallelism": "fsdp:2", "device": "cuda:1"}, "torch", "use device = cuda, not cuda:1"),
    ({"parallelism": "tp:2", "precision": "amp-fp16", "device": "cuda"}, "torch", "runs fp32, tf32 or amp-bf16"),
    ({"parallelism": "fsdp:2", "checkpointing": "activations"}, "torch", "use checkpointing = none"),
    ({"parallelism": "tp:2", "workload": "mlp"}, "torch", "mlp has none (the built-in transformers: gpt, vit"),
    ({"parallelism": "fsdp:2", "compile": "cuda-graph", "device": "cuda"}, "torch", "use single or grad-accum:N"),
    ({"parallelism": "tp:2", "workload": "cnn"}, "jax", "cnn has none (the built-in transformers: gpt, vit"),
    ({"parallelism": "tp:2", "workload": "flax_lm:flax_lm"}, "jax", "a Flax module's layers are its own"),
    ({"parallelism": "tp:3"}, "jax", "tp:3 gives each device 1/3 of the attention heads and of the MLP's hidden "
                                     "units; 3 does not divide heads 4, d_model 128, MLP width 512"),
    ({"parallelism": "tp:3"}, "torch", "tp:3 gives each device 1/3 of the attention heads and of the MLP's hidden "
                                       "units; 3 does not divide heads 4, d_model 128, MLP width 512"),
    ({"parallelism": "fsdp:2+tp:3"}, "torch", "tp:3 gives each device 1/3 of the attention heads"),  # B, not A x B
    ({"parallelism": "fsdp:2", "device": "cuda:1"}, "jax", "use device = cuda or cpu, not cuda:1"),
    ({"parallelism": "fsdp:2"}, "tensorflow", "Keras has no sharded strategy gpubench drives"),
    ({"parallelism": "tp:2"}, "tensorflow", "tp:N (a transformer's projections split over the ranks) is PyTorch's"),
    ({"parallelism": "fsdp:2+tp:2", "workload": "mlp"}, "torch", "fsdp:A+tp:B splits a transformer's attention"),
    ({"parallelism": "fsdp:2+tp:2", "precision": "amp-fp16", "device": "cuda"}, "torch", "fsdp:A+tp:B runs fp32"),
    ({"parallelism": "fsdp:2+tp:2"}, "jax", "supports: single, grad-accum:N, dp:N, fsdp:N, tp:N (fsdp:A+tp:B (FSDP"),
])
def test_what_sharding_cannot_run_says_why(settings, framework, reason):
    from gpubench.backends import get_backend

    config = Config(**{"workload": "gpt", **settings, "framework": framework})
    assert reason in (get_backend(framework).unsupported(config) or ""), config.config_id


JAX_TP_COLLECTIVES = """
import collections, dataclasses, re, sys
import jax
jax.config.update("jax_num_cpu_devices", 2)
import gpubench.backends
from gpubench.backends.jax.native import native_model
from gpubench.backends.jax.trainer import JaxTrainer
from gpubench.config import Config
wp = (("d_model", 32), ("heads", 4), ("layers", 2), ("seq_len", 16), ("vocab", 64))
config = Config(workload="gpt", framework="jax", batch_size=8, parallelism="tp:2", workload_params=wp)
native = native_model(config, count=False)
trainer = JaxTrainer(native, config, native.make_batches(8, 2))
hlo = trainer._step.lower(trainer._carry, trainer.x, trainer.y).compile().as_text()
print(dict(collections.Counter(re.findall(r"= \\S+ (all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)"
                                          r"(?:-start)?\\(", hlo))))
"""


@pytest.mark.slow
def test_jax_tp_compiles_to_megatrons_all_reduces_only():
    """JAX's tp:2 of a 2-block GPT: each block's q, k, v rows in chunks of whole heads, so the
    compiled step moves nothing but the Megatron split's all-reduces: one after attention's and
    one after the MLP's row-wise projection in the forward, and one for each column-wise
    projection's input gradient in the backward, 4 a block."""
    pytest.importorskip("jax")
    proc = subprocess.run([sys.executable, "-c", JAX_TP_COLLECTIVES], capture_output=True, text=True, timeout=300,
                          env=plain_env(PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "{'all-reduce': 8}"


def _tiny_llama():
    from gpubench.backends.pytorch.native import torchvision_without_its_operators

    torchvision_without_its_operators()  # (transformers imports torchvision where it is installed)
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    return transformers.LlamaForCausalLM(config)


def test_the_blocks_fsdp_wraps_and_the_projections_tp_splits(monkeypatch):
    """Blocks by shape: a Sequential's children (a built-in workload), a ModuleList's entries
    (nanoGPT's shape, a Hugging Face decoder's layers); a tied embedding and head stay with the
    root; a model of bare layers has none. Projections by name: gpubench's block, Llama's."""
    pytest.importorskip("torch")
    from torch import nn

    from gpubench.backends.pytorch.model import Block, build_model
    from gpubench.backends.pytorch.sharding import _plan_of, blocks, state_bytes
    from gpubench.workloads import get_workload

    monkeypatch.syspath_prepend(str(CORPUS))
    import gpt as corpus_gpt

    mlp = build_model(get_workload("mlp").spec(depth=1, width=32))
    assert [type(b).__name__ for b in blocks(mlp)] == ["Linear", "Linear"]
    gpt = build_model(get_workload("gpt").spec(layers=2, d_model=32, heads=4, seq_len=16, vocab=64))
    # the embedding and the output head share a weight: neither is a block of its own
    assert [type(b).__name__ for b in blocks(gpt)] == ["Block", "Block", "LayerNorm"]
    assert [_plan_of(b) for b in gpt if isinstance(b, Block)] == ["gpubench", "gpubench"]
    user = corpus_gpt.gpt()
    assert blocks(user) == list(user.blocks)
    assert _plan_of(user.blocks[0]) is None  # its MLP is a Sequential, not named projections
    llama = _tiny_llama()
    assert blocks(llama) == list(llama.model.layers)
    assert _plan_of(llama.model.layers[0]) == "llama"

    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    assert blocks(Bare()) == []
    # the state a device holds: parameters, their gradients, Adam's two moments of each
    import torch

    model = nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    size = (4 * 2 + 2) * 4
    assert state_bytes(model, optimizer) == {"params_bytes": size, "grads_bytes": size, "optimizer_bytes": 2 * size
                                             + 2 * 4}  # (and each parameter's step count, a float32 scalar)


SHARDED = """
[defaults]
steps = 3
windows = 2
warmup_steps = 1
optimizer = "sgd"
lr = 0.05
threads = 1
telemetry_interval_ms = 0
timeout_s = 240
layers = 2
d_model = 32
heads = 4
seq_len = 16
vocab = 64
depth = 1
width = 32
[matrix]
workload = ["mlp", "gpt"]
framework = ["torch"]
batch_size = [16]
parallelism = ["single"]
[[matrix.include]]
workload = "mlp"
batch_size = 8
parallelism = "fsdp:2"
[[matrix.include]]
workload = "mlp"
batch_size = 4
parallelism = "fsdp:4"
[[matrix.include]]
workload = "mlp"
batch_size = "max"
max_batch_start = 4
max_batch_limit = 8
parallelism = "fsdp:2"
[[matrix.include]]
workload = "gpt"
batch_size = 8
parallelism = ["single", "fsdp:2", "ddp:2", "tp:2", "fsdp:2+tp:2"]
[[matrix.include]]
workload = "gpt"
framework = "jax"
batch_size = 16
parallelism = "single"
[[matrix.include]]
workload = "gpt"
framework = "jax"
batch_size = 8
parallelism = "fsdp:2"
[[matrix.include]]
workload = "gpt"
framework = "jax"
batch_size = 4
parallelism = "fsdp:4"
[[matrix.include]]
workload = "gpt"
framework = "jax"
batch_size = 8
parallelism = "tp:2"
[[matrix.include]]
workload = "gpt:gpt"
loss_output = "1"
input_shape = [64]
batch_size = 8
parallelism = ["single", "tp:2"]
[[matrix.include]]
workload = "gpt:gpt"
loss_output = "1"
input_shape = [64]
batch_size = 4
parallelism = "fsdp:2"
[[matrix.include]]
workload = "hf:llama"
input_shape = [16]
"args.hidden_size" = 32
"args.intermediate_size" = 64
"args.num_hidden_layers" = 2
"args.num_attention_heads" = 4
"args.num_key_value_heads" = 2
"args.vocab_size" = 64
batch_size = 8
parallelism = ["single", "tp:2"]
"""


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """One run of the MLP, GPT and a user's transformer (tests/corpus/gpt.py) under single,
    fsdp:2, fsdp:4, ddp:2 and tp:2 in PyTorch, a Hugging Face Llama (random weights) under tp:2,
    and GPT under fsdp:2 and fsdp:4 in JAX, with its
    report, shared by the tests below (SGD: the losses compare step for step)."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    tmp = tmp_path_factory.mktemp("sharded")
    (tmp / "s.toml").write_text(SHARDED)
    env = plain_env(PYTHONPATH=f"{REPO}:{CORPUS}")
    proc = run_cli(["run", "s.toml", "--out", "runs", "--no-report"], cwd=tmp, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp / "runs").iterdir()
    report = run_cli(["report", str(run_dir), "--out", "report"], cwd=tmp, env=env)
    assert report.returncode == 0, report.stdout + report.stderr
    by = {(r["config"]["workload"], r["config"]["framework"], r["config"]["parallelism"], r["config"]["batch_size"]): r
          for r in result_lines(run_dir)}
    return tmp, by


def _losses(r):
    assert r["status"] == "ok", (r["config_id"], r.get("reason"))
    return [r["metrics"]["loss"]["first"], *r["metrics"]["loss"]["windows"]]


@pytest.mark.slow
def test_fsdp_and_tp_train_the_losses_of_single_at_the_same_global_batch(sharded_run):
    _, by = sharded_run
    for workload in ("mlp", "gpt", "gpt:gpt"):
        single = by[(workload, "torch", "single", 16 if workload != "gpt:gpt" else 8)]
        fsdp = by[(workload, "torch", "fsdp:2", 8 if workload != "gpt:gpt" else 4)]  # 2 ranks x 8 = 16
        assert _losses(fsdp) == pytest.approx(_losses(single), rel=1e-5), workload
        assert fsdp["metrics"]["samples_per_step"] == single["metrics"]["samples_per_step"]
        assert fsdp["runtime"]["distributed"] == "fully_shard(gloo, world_size=2)"
    four = by[("mlp", "torch", "fsdp:4", 4)]
    assert _losses(four) == pytest.approx(_losses(by[("mlp", "torch", "single", 16)]), rel=1e-5)
    assert [r["rank"] for r in four["metrics"]["ranks"]] == [0, 1, 2, 3]
    assert "ranks_weights_identical" not in four["metrics"]  # each rank holds its own shard
    # batch_size = "max" under fsdp:2: each probe of the search is an fsdp:2 launch of its own
    # (nothing runs out of memory on the CPU: the search ends at max_batch_limit), then the config
    # trains at the batch found, the losses of fsdp:2 at that batch
    found = by[("mlp", "torch", "fsdp:2", "max")]
    search = found["metrics"]["batch_search"]
    assert [(p["batch_size"], p["status"]) for p in search["probes"]] == [(4, "ok"), (8, "ok")]
    assert (search["max_batch"], search["first_oom"], found["metrics"]["samples_per_step"]) == (8, None, 16)
    assert found["runtime"]["distributed"] == "fully_shard(gloo, world_size=2)"
    assert _losses(found) == _losses(by[("mlp", "torch", "fsdp:2", 8)])
    # tp:2 splits each block's projections; every rank sees the whole batch of 8
    tp, single8 = by[("gpt", "torch", "tp:2", 8)], by[("gpt", "torch", "single", 8)]
    assert _losses(tp) == pytest.approx(_losses(single8), rel=1e-5)
    assert (tp["metrics"]["devices"], tp["metrics"]["samples_per_step"]) == (2, 8)
    assert tp["runtime"]["sharding"] == {"tp": {"blocks": 2, "plan": ["gpubench"],
                                                "split": ["fc1", "fc2", "proj", "qkv"]}}
    assert by[("gpt", "torch", "fsdp:2", 8)]["runtime"]["sharding"]["fsdp"]["block_types"] == ["Block", "LayerNorm"]
    # fsdp:2+tp:2: two replicas of 8 samples, each a tensor-parallel pair, sharded across the pairs
    two_d = by[("gpt", "torch", "fsdp:2+tp:2", 8)]
    assert _losses(two_d) == pytest.approx(_losses(by[("gpt", "torch", "single", 16)]), rel=1e-5)
    assert (two_d["metrics"]["devices"], two_d["metrics"]["samples_per_step"]) == (4, 16)
    assert two_d["runtime"]["distributed"] == "parallelize_module+fully_shard(gloo, world_size=4)"
    assert list(two_d["runtime"]["sharding"]) == ["tp", "fsdp"]
    # a Hugging Face Llama: its q, k, v, o and MLP projections split by name
    llama, llama_single = by[("hf:llama", "torch", "tp:2", 8)], by[("hf:llama", "torch", "single", 8)]
    assert _losses(llama) == pytest.approx(_losses(llama_single), rel=1e-5)
    assert llama["runtime"]["sharding"]["tp"]["plan"] == ["llama"] and llama["runtime"]["sharding"]["tp"]["blocks"] == 2
    # the user's GPT has no projections gpubench knows by name
    refused = by[("gpt:gpt", "torch", "tp:2", 8)]
    assert refused["status"] == "unsupported" and "no block with projections gpubench knows" in refused["reason"]
    # JAX: the parameters and optimizer state sharded over a mesh of host devices, one process
    jax_single = by[("gpt", "jax", "single", 16)]
    for n, batch in ((2, 8), (4, 4)):
        r = by[("gpt", "jax", f"fsdp:{n}", batch)]
        assert _losses(r) == pytest.approx(_losses(jax_single), rel=1e-4), n
        assert "the parameters and optimizer state split" in r["runtime"]["distributed"]
    assert _losses(jax_single) == pytest.approx(_losses(by[("gpt", "torch", "single", 16)]), rel=1e-4)
    # JAX tp:2: the blocks' projections split on a mesh's "model" axis, every device on the whole batch
    jax_tp = by[("gpt", "jax", "tp:2", 8)]
    assert _losses(jax_tp) == pytest.approx(_losses(single8), rel=1e-4)
    assert (jax_tp["metrics"]["devices"], jax_tp["metrics"]["samples_per_step"]) == (2, 8)
    assert jax_tp["runtime"]["sharding"] == tp["runtime"]["sharding"]  # the same blocks and projections split


@pytest.mark.slow
def test_the_state_per_device_falls_as_one_over_n(sharded_run):
    _, by = sharded_run

    def state(r, rank=None):
        m = r["metrics"]
        return m["memory"]["state_bytes_per_device"] if rank is None else m["ranks"][rank]["state_bytes_per_device"]

    for workload, framework, n, batch in (("mlp", "torch", 2, 8), ("mlp", "torch", 4, 4), ("gpt", "torch", 2, 8),
                                          ("gpt", "jax", 2, 8), ("gpt", "jax", 4, 4)):
        whole = state(by[(workload, framework, "single", 16)])
        r = by[(workload, framework, f"fsdp:{n}", batch)]
        if framework == "torch":  # every rank's shard of dimension 0: together, the whole
            assert sum(state(r, k) for k in range(n)) == whole, (workload, n)
            assert max(state(r, k) for k in range(n)) <= -(-whole // n) + 4 * 1024, (workload, n)
        else:  # the GPT's every array divides by 2 and 4: exactly 1/N on the first device
            assert state(r) * n == whole, n
    ddp = by[("gpt", "torch", "ddp:2", 8)]
    single = by[("gpt", "torch", "single", 8)]
    assert state(ddp, 0) == state(ddp, 1) == state(single)  # replicas: the whole state on each
    jax_tp, jax_single = by[("gpt", "jax", "tp:2", 8)], by[("gpt", "jax", "single", 16)]
    assert state(jax_single) / 2 < state(jax_tp) < state(jax_single)  # as PyTorch's tp:2 below
    tp = by[("gpt", "torch", "tp:2", 8)]
    parts = tp["metrics"]["memory"]["state_bytes"]
    assert set(parts) == {"params_bytes", "grads_bytes", "optimizer_bytes"}
    assert state(single) / 2 < state(tp) < state(single)  # the projections halved, the rest replicated
    # fsdp:2+tp:2 halves each tp rank's state again: its four ranks hold what tp:2's two do
    two_d = by[("gpt", "torch", "fsdp:2+tp:2", 8)]
    assert sum(state(two_d, k) for k in range(4)) == sum(state(tp, k) for k in range(2))
    assert max(state(two_d, k) for k in range(4)) < state(tp) * 0.51


@pytest.mark.slow
def test_the_report_compares_fsdp_with_ddp_and_charts_each_device_against_n(sharded_run):
    tmp, by = sharded_run
    summary = (tmp / "report" / "summary.md").read_text()
    section = summary.split("### Sharded over replicated (fsdp:N over ddp:N)")[1].split("###")[0]
    (row,) = [line for line in section.splitlines() if "fsdp2" in line]
    fsdp, ddp = by[("gpt", "torch", "fsdp:2", 8)], by[("gpt", "torch", "ddp:2", 8)]
    assert f"| {fsdp['config_id']} | {ddp['config_id']} |" in row
    saved = 1 - fsdp["metrics"]["memory"]["state_bytes_per_device"] / ddp["metrics"]["memory"]["state_bytes_per_device"]
    assert f"| {100 * saved:.1f}% |" in row and saved == pytest.approx(0.5, abs=0.01)
    ratio = fsdp["metrics"]["throughput"]["median"] / ddp["metrics"]["throughput"]["median"]
    assert row.rstrip().endswith(f"| {ratio:.2f}x |")
    assert (tmp / "report" / "charts" / "per_device_vs_devices.png").stat().st_size > 10_000
    html = (tmp / "report" / "index.html").read_text()
    assert 'id="sharding"' in html and "per_device_vs_devices.png" in html
    csv = (tmp / "report" / "results.csv").read_text().splitlines()
    assert "state_bytes_per_device" in csv[0].split(",")
    assert json.loads(json.dumps(fsdp["metrics"]["memory"]["state_bytes"]))["optimizer_bytes"] > 0
