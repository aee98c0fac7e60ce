"""Device plumbing on a CPU machine: what `--device` resolves to on faked machines, precision, placement, the
trainer and the transformers sampler on the chosen device, LoRA and checkpoints independent of the device."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from swarm_node import variants
from swarm_node.config import SamplerConfig, TrainConfig, load_config
from swarm_node.errors import ConfigError, UserError
from swarm_node.model import checkpoint, lora
from swarm_node.model.default_model import load_model
from swarm_node.model.device import (
    DEVICES,
    PRECISIONS,
    DeviceChoice,
    Found,
    cpu_flags,
    host_copy,
    model_device,
    place,
    resolve_device,
    sampler_dtype,
)
from swarm_node.sampler.base import SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.train.batching import collate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample

H100 = Found(cuda=("NVIDIA H100 80GB HBM3",), cuda_bf16=(True,))
TWO_CARDS = Found(cuda=("NVIDIA GeForce RTX 3090", "Tesla T4"), cuda_bf16=(True, False))


def test_registries_hold_the_declared_names() -> None:
    assert DEVICES.names == variants.DEVICES and sorted(DEVICES) == sorted(variants.DEVICES)
    assert PRECISIONS.names == variants.PRECISIONS and sorted(PRECISIONS) == sorted(variants.PRECISIONS)


@pytest.mark.parametrize(("spec", "found", "device", "line"), [
    ("auto", Found(), "cpu", "device: auto picked cpu (no CUDA or MPS device found)"),
    ("auto", H100, "cuda:0", "device: auto picked cuda:0 (NVIDIA H100 80GB HBM3; --device cpu to stay on the CPU)"),
    ("auto", TWO_CARDS, "cuda:0", "device: auto picked cuda:0 (NVIDIA GeForce RTX 3090 of 2 CUDA devices; "
                                  "--device cpu to stay on the CPU)"),
    ("auto", Found(mps=True), "mps", "device: auto picked mps (no CUDA device; --device cpu to stay on the CPU)"),
    ("cpu", H100, "cpu", "device: cpu (asked for)"),
    ("cuda", H100, "cuda:0", "device: cuda:0 (NVIDIA H100 80GB HBM3, asked for)"),
    ("cuda:1", TWO_CARDS, "cuda:1", "device: cuda:1 (Tesla T4, asked for)"),
    ("mps", Found(mps=True), "mps", "device: mps (asked for)"),
])
def test_resolve_device(spec: str, found: Found, device: str, line: str) -> None:
    assert resolve_device(spec, found) == DeviceChoice(device, line)


@pytest.mark.parametrize(("spec", "found", "message"), [
    ("cuda", Found(), "--device cuda: no CUDA device here; found CPU only (no CUDA, no MPS)"),
    ("cuda:0", Found(mps=True), "--device cuda:0: no CUDA device here; found CPU and MPS"),
    ("cuda:2", TWO_CARDS, "--device cuda:2: no such card; found CPU and 2 CUDA devices (cuda:0 NVIDIA GeForce RTX "
                          "3090, cuda:1 Tesla T4)"),
    ("mps", H100, "--device mps: no MPS device here; found CPU and 1 CUDA device (cuda:0 NVIDIA H100 80GB HBM3)"),
    ("tpu", Found(), "--device 'tpu' unknown; choose one of auto, cpu, cuda, cuda:N, mps"),
    ("cpu:1", Found(), "--device 'cpu:1' unknown; choose one of auto, cpu, cuda, cuda:N, mps"),
])
def test_missing_device_is_one_line_naming_what_was_found(spec: str, found: Found, message: str) -> None:
    with pytest.raises(UserError) as err:
        resolve_device(spec, found)
    assert str(err.value) == message


@pytest.mark.parametrize(("precision", "spec", "found", "dtype"), [
    ("auto", "cpu", Found(), None),
    ("auto", "cuda:0", H100, torch.bfloat16),
    ("auto", "cuda:1", TWO_CARDS, None),  # a T4 has no bf16
    ("auto", "mps", Found(mps=True), None),
    ("fp32", "cuda:0", H100, None),
    ("bf16", "cuda:0", H100, torch.bfloat16),
    ("bf16", "cpu", Found(), torch.bfloat16),
])
def test_precision(precision: str, spec: str, found: Found, dtype: torch.dtype | None) -> None:
    assert PRECISIONS[precision](resolve_device(spec, found), found) == dtype


def test_bf16_where_the_device_lacks_it_is_an_error() -> None:
    with pytest.raises(UserError, match=r"^train.precision bf16: cuda:1 does not compute in bf16; use precision "
                                        r"fp32 or auto$"):
        PRECISIONS["bf16"](resolve_device("cuda:1", TWO_CARDS), TWO_CARDS)


def test_config_device_and_budget() -> None:
    cfg = load_config(overrides={"run.device": "cuda:1", "run.memory_budget_mib": 2048, "train.precision": "bf16"})
    assert (cfg.run.device, cfg.run.memory_budget_mib, cfg.train.precision) == ("cuda:1", 2048, "bf16")
    for bad, message in [({"run.device": "cuda:x"}, "run.device 'cuda:x' unknown"),
                         ({"run.device": "gpu"}, "run.device 'gpu' unknown"),
                         ({"run.memory_budget_mib": -1}, "run.memory_budget_mib must be >= 0, got -1"),
                         ({"train.precision": "fp8"}, "train.precision 'fp8' unknown; choose one of auto, fp32, bf16")]:
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=bad)


def test_model_placed_on_the_chosen_device(tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir)
    lora.attach_lora(model, 2, 4.0)
    choice = resolve_device("auto", Found())
    assert place(model, choice.device) is model
    assert {p.device for p in model.parameters()} == {torch.device("cpu")}
    assert model_device(model) == torch.device("cpu")
    trainer = Trainer(model, TrainConfig(), SamplerConfig(), pad_id=0)
    assert trainer.device == torch.device("cpu") and trainer.autocast is None
    assert HFSampler(model, _tokenizer(tiny_model_dir)).device == torch.device("cpu")


def _tokenizer(path: Path):  # noqa: ANN202 - the tokenizer type is transformers'
    return load_model(path)[1]


def _sample(prompt: list[int], completion: list[int], adv: float) -> TrainSample:
    return TrainSample(prompt, completion, [-1.0] * len(completion), adv)


def test_trainer_takes_cpu_batches_and_bf16_autocast_keeps_fp32_master_weights(tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir)
    fp32 = Trainer(model, TrainConfig(), SamplerConfig(), pad_id=0)
    batch = collate([_sample([3, 4, 5], [6, 7], 1.0), _sample([3, 4], [8], -1.0)], pad_id=0)
    assert fp32.on_device(batch) is batch  # already where the trainer is: not copied
    lp32, _ = fp32.token_log_probs(model, batch)
    bf16 = Trainer(model, TrainConfig(), SamplerConfig(), pad_id=0, autocast=torch.bfloat16)
    lp16, _ = bf16.token_log_probs(model, batch)
    assert lp16.dtype == torch.float32 and lp32.dtype == torch.float32  # log-softmax in fp32 either way
    assert torch.allclose(lp16, lp32, atol=0.1) and not torch.equal(lp16, lp32)
    stats = bf16.train_step([_sample([3, 4, 5], [6, 7], 1.0), _sample([3, 4, 5], [8], -1.0)])
    assert stats.minibatches == 1 and math.isfinite(stats.loss)  # one group: one non-empty minibatch
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {v.dtype for s in bf16.optimizer.state.values() for k, v in s.items() if k != "step"} == {torch.float32}


def test_hf_sampler_passes_cover_whole_prompts(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir)
    sampler = HFSampler(model, tokenizer)
    assert sampler.passes(5, 4) == [range(0, 5)]
    sampler.max_rows = 8
    assert sampler.passes(5, 4) == [range(0, 2), range(2, 4), range(4, 5)]
    sampler.max_rows = 3  # fewer rows than a group: still one whole prompt per pass
    assert sampler.passes(2, 4) == [range(0, 1), range(1, 2)]


def test_hf_sampler_in_passes_greedy_equals_one_pass_and_leaves_rng(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir)
    sampler = HFSampler(model, tokenizer)
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    whole = sampler.generate(prompts, 2, greedy)
    sampler.max_rows = 2
    state = torch.random.get_rng_state()
    split = sampler.generate(prompts, 2, SamplingParams(temperature=0.0, max_new_tokens=4, seed=7))
    assert torch.equal(torch.random.get_rng_state(), state)  # a seeded call leaves the caller's RNG as it was
    assert [[c.token_ids for c in g] for g in split] == [[c.token_ids for c in g] for g in whole]
    assert [len(g) for g in split] == [2, 2, 2]


def test_lora_init_is_drawn_on_the_cpu(tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir)
    names = lora.attach_lora(model, 2, 4.0, seed=5)
    first = lora.lora_modules(model)[names[0]]
    bound = 1 / math.sqrt(first.in_features)
    expected = torch.empty(2, first.in_features).uniform_(-bound, bound, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first.lora_A.weight.detach(), expected)
    assert torch.equal(first.lora_B.weight.detach(), torch.zeros(first.out_features, 2))


def test_host_copy_owns_cpu_tensors() -> None:
    t = torch.arange(6.0).reshape(2, 3).t()  # not contiguous
    out = host_copy({"w": t})["w"]
    assert out.device.type == "cpu" and out.is_contiguous() and torch.equal(out, t)
    assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def _trained(tiny_model_dir: Path) -> tuple[torch.nn.Module, Trainer]:
    model, _ = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(minibatches=1), SamplerConfig(), pad_id=0)
    trainer.train_step([_sample([3, 4, 5], [6, 7], 1.0), _sample([3, 4, 5], [8], -1.0)])
    return model, trainer


def test_checkpoint_is_written_from_cpu_copies(tiny_model_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model, trainer = _trained(tiny_model_dir)
    written: dict[str, dict[str, torch.Tensor]] = {}
    real = checkpoint.save_file

    def spy(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
        written[Path(path).name] = tensors
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(checkpoint, "save_file", spy)
    checkpoint.save_checkpoint(tmp_path, 1, model, trainer.optimizer, {"policy_version": 1})
    live = {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    live |= {v.untyped_storage().data_ptr() for s in trainer.optimizer.state.values() for v in s.values()}
    assert sorted(written) == ["model.safetensors", "optimizer.safetensors", "rng.safetensors"]
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert all(t.device.type == "cpu" for t in written[name].values())
        assert not {t.untyped_storage().data_ptr() for t in written[name].values()} & live, name
    # Tied weights are written once, as safetensors' save_model did: the file's names are unchanged.
    assert "lm_head.weight" not in written["model.safetensors"]
    assert "model.embed_tokens.weight" in written["model.safetensors"]


def test_checkpoint_from_another_device_loads_onto_cpu_then_into_the_model(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU node writes the same bytes (every tensor goes through host_copy); reading maps them to the CPU and
    torch copies them into the parameters' and the optimizer's device, whatever that is."""
    model, trainer = _trained(tiny_model_dir)
    # As a GPU node's config would say: nothing of it is used on load.
    checkpoint.save_checkpoint(tmp_path, 1, model, trainer.optimizer, {"policy_version": 1,
                                                                         "config": {"run": {"device": "cuda:0"}}})
    ckpt = checkpoint.latest_checkpoint(tmp_path)
    assert ckpt is not None
    devices: list[object] = []
    real_load = checkpoint.load_file

    def spy(path: str, device: str = "cpu") -> dict[str, torch.Tensor]:
        devices.append(device)
        return real_load(path, device=device)

    monkeypatch.setattr(checkpoint, "load_file", spy)
    fresh, _ = load_model(tiny_model_dir)
    fresh_trainer = Trainer(fresh, TrainConfig(minibatches=1), SamplerConfig(), pad_id=0)
    checkpoint.restore(ckpt, fresh, fresh_trainer.optimizer)
    assert devices == ["cpu", "cpu"]
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for p in fresh_trainer.params:
        state = fresh_trainer.optimizer.state[p]
        assert state["exp_avg"].device == p.device and state["exp_avg_sq"].device == p.device


CPU = DeviceChoice("cpu", "")
CARD = DeviceChoice("cuda:0", "")


@pytest.mark.parametrize(("model_dtype", "choice", "found", "dtype", "line"), [
    # A float32 checkpoint samples in float32, silently.
    ("float32", CPU, Found(cpu_flags=frozenset({"avx512_bf16"})), "float32", None),
    # bf16 on a CPU with AVX-512 BF16 (this machine: an AMD EPYC with avx512_bf16, no AMX) or AMX.
    ("bfloat16", CPU, Found(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"})), "bfloat16",
     "sampler dtype: bfloat16, the model's (cpu computes in it)"),
    ("bfloat16", CPU, Found(cpu_flags=frozenset({"amx_bf16", "amx_tile"})), "bfloat16",
     "sampler dtype: bfloat16, the model's (cpu computes in it)"),
    ("bfloat16", CPU, Found(cpu_flags=frozenset({"avx2", "avx512f"})), "float32",
     "sampler dtype: float32, not the model's bfloat16: this CPU has neither avx512_bf16 nor amx_bf16"),
    ("bfloat16", CARD, Found(cuda=("A100",), cuda_bf16=(True,)), "bfloat16",
     "sampler dtype: bfloat16, the model's (cuda:0 computes in it)"),
    ("bfloat16", CARD, Found(cuda=("T4",), cuda_bf16=(False,)), "float32",
     "sampler dtype: float32, not the model's bfloat16: cuda:0 does not compute in bf16"),
    ("float16", CARD, Found(cuda=("T4",), cuda_bf16=(False,)), "float16",
     "sampler dtype: float16, the model's (cuda:0 computes in it)"),
    ("float16", CPU, Found(), "float32",
     "sampler dtype: float32, not the model's float16: float16 sampling runs on CUDA only, not cpu"),
])
def test_sampler_dtype_for_the_machine(model_dtype: str, choice: DeviceChoice, found: Found, dtype: str,
                                       line: str | None) -> None:
    picked = sampler_dtype(model_dtype, choice, found)
    assert (picked.name, picked.line) == (dtype, line)


def test_cpu_flags_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_flags(info) == frozenset({"fpu", "avx2", "avx512f", "avx512_bf16"})
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_hf_sampler_runs_in_the_dtype_it_is_given(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir)
    sampler = HFSampler(model, tokenizer, dtype="bfloat16")
    assert {p.dtype for p in sampler.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the trainer's copy is left as it was
    out = sampler.generate([[3, 4, 5]], 2, SamplingParams(max_new_tokens=3, seed=0))
    assert all(math.isfinite(lp) and lp <= 0 for c in out[0] for lp in c.logprobs)
