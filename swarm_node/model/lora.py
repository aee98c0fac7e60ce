"""LoRA adapters on an HF causal LM, in the on-disk layout peft writes and vLLM's `LoRARequest` loads.

Contract:
- `attach_lora(model, rank, alpha)` replaces every targeted `nn.Linear` (attention and MLP projections) by a
  `LoRALinear`: y = W x + b + (alpha / rank) * B A x, with A [rank, in] drawn like peft (Kaiming-uniform) and B
  [out, rank] zero, so the model is unchanged at attach time. Every other parameter is frozen. The base weights
  keep their names in `state_dict()`; the adapter adds `<module>.lora_A.weight` and `<module>.lora_B.weight`.
- `adapter_tensors(model)` is the adapter under peft's saved names (`base_model.model.<module>.lora_A.weight`);
  `merged_state(model)` is the base state dict with W + scale * B A folded in (for samplers that take plain
  weights); `write_adapter(dir, tensors, rank, alpha)` writes adapter_config.json + adapter_model.safetensors
  atomically (a reader never sees a half-written adapter). Adapters follow their base layer's device; their
  initial values are drawn on the CPU, so a seed gives the same adapters on every device.
- `WEIGHT_FORMS[name](model)` is the state dict a sampler of that weight form (`Sampler.weights`: "full",
  "base", "adapter"; names in `swarm_node.variants.WEIGHT_FORMS`) loads from a LoRA-trained model.
Why our own layer and not peft: the node checkpoints, deltas and samplers address weights by the base model's
names, which peft's wrapping renames (`base_layer.weight`); this layer keeps them and is ~40 lines.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from swarm_node import variants
from swarm_node.model.device import host_copy

# Qwen2/Llama projection names: vLLM serves LoRA on each (q/k/v packed as qkv_proj, gate/up as gate_up_proj).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


class LoRALinear(nn.Linear):
    """An nn.Linear (same weight and bias names) plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        # Built on the meta device: the base's own weight and bias replace the placeholders at once.
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
        self.weight = base.weight
        self.bias = base.bias
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        like = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **like)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **like)
        bound = 1 / math.sqrt(base.in_features)  # kaiming_uniform_(a=sqrt(5)), peft's default init of A
        # Drawn on the CPU (the seeded generator's device) and copied to the base's device: the same adapters
        # whatever device the model is on.
        init = torch.empty(rank, base.in_features, dtype=base.weight.dtype).uniform_(-bound, bound, generator=generator)
        with torch.no_grad():
            self.lora_A.weight.copy_(init)
            self.lora_B.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.lora_B(self.lora_A(x)) * self.scale

    def merged_weight(self) -> torch.Tensor:
        return self.weight + self.scale * (self.lora_B.weight @ self.lora_A.weight)


def attach_lora(model: nn.Module, rank: int, alpha: float, seed: int = 0) -> list[str]:
    """Freeze the model and give each targeted projection a LoRA update; returns the wrapped module names."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    if lora_modules(model):
        raise ValueError("the model already has LoRA adapters")
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    names = [name for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in TARGET_MODULES]
    if not names:
        raise ValueError(f"the model has none of the LoRA target modules {', '.join(TARGET_MODULES)}")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha, generator))
    return names


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, m in lora_modules(model).items():
        out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = m.lora_A.weight.detach().clone().contiguous()
        out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = m.lora_B.weight.detach().clone().contiguous()
    return out


def merged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base weights with each adapter folded in, under the base model's names (no lora_* entries)."""
    modules = lora_modules(model)
    state = {k: v for k, v in model.state_dict().items() if ".lora_A." not in k and ".lora_B." not in k}
    for name, m in modules.items():
        state[f"{name}.weight"] = m.merged_weight().detach()
    return state


WeightForm = Callable[[nn.Module], dict[str, torch.Tensor]]
WEIGHT_FORMS: variants.Registry[WeightForm] = variants.Registry("weight form", variants.WEIGHT_FORMS)


@WEIGHT_FORMS.register("full")
def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict, adapters included (a sampler that runs our LoRA layers itself)."""
    return model.state_dict()


WEIGHT_FORMS.add("base", merged_state)  # plain weights with the adapters folded in
WEIGHT_FORMS.add("adapter", adapter_tensors)  # the adapter alone, under peft's names


def adapter_config(rank: int, alpha: float, targets: list[str]) -> dict[str, object]:
    """adapter_config.json as peft writes it for a plain LoRA (what vLLM's PEFTHelper reads)."""
    return {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": sorted(targets), "bias": "none",
            "lora_dropout": 0.0, "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "task_type": "CAUSAL_LM", "init_lora_weights": True}


def adapter_targets(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The projection names an adapter's tensors cover (`...self_attn.q_proj.lora_A.weight` -> q_proj)."""
    return sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors})


def write_adapter(directory: Path, tensors: dict[str, torch.Tensor], rank: int, alpha: float) -> Path:
    """Write an adapter to `directory`, replaced whole: written aside, then renamed into place."""
    if not tensors or not all(name.startswith(PEFT_PREFIX) and (".lora_A." in name or ".lora_B." in name)
                              for name in tensors):
        raise ValueError("not LoRA adapter tensors (expected base_model.model.<module>.lora_A/B.weight names)")
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(rank, alpha, adapter_targets(tensors)), indent=1))
    save_file(host_copy(tensors), str(tmp / ADAPTER_WEIGHTS))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory
