"""`[simulation] sampler = "shared-lora"`: one vLLM engine serves every simulated node's policy as a LoRA adapter."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from simulations.runner import run_cell
from simulations.scenario import parse_scenario
from swarm_node.errors import UserError

LORA = {"run": {"group_size": 8, "prompts_per_step": 2}, "sampler": {"max_new_tokens": 4, "threads": 1,
                                                                      "max_num_seqs": 16, "kv_cache_gb": 0.01},
        "train": {"threads": 1, "minibatches": 1, "lora_rank": 4, "lora_alpha": 8.0, "lr": 1e-3}}


@pytest.mark.parametrize(("data", "message"), [
    ({"simulation": {"sampler": "one"}}, "simulation.sampler must be one of per-node, shared-lora, not 'one'"),
    ({"simulation": {"sampler": "shared-lora"}}, "needs config.train.lora_rank >= 1"),
    ({"simulation": {"sampler": "shared-lora"}, "config": {"train": {"lora_rank": 4}},
      "node": [{"index": 1, "config": {"train": {"lora_alpha": 4.0}}}]}, "the same lora_rank and lora_alpha"),
    ({"simulation": {"sampler": "shared-lora"}, "config": {"train": {"lora_rank": 4}},
      "node": [{"index": 1, "model": "."}]}, "serves one base model"),
    ({"simulation": {"sampler": "shared-lora", "mode": "echo"}, "config": {"train": {"lora_rank": 4}}},
     "not available in mode 'echo'"),
])
def test_bad_shared_lora_scenarios_are_one_line_errors(data: dict, message: str) -> None:
    data = {**data, "simulation": {"nodes": 2, **data["simulation"]}}
    with pytest.raises(UserError) as err:
        parse_scenario(data, "t")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.vllm
def test_shared_engine_cell_trains_each_nodes_adapter(warm_tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    scn = parse_scenario({"simulation": {"nodes": 3, "rounds": 2, "eval_problems": 5, "seeds": [0],
                                         "sampler": "shared-lora"},
                          "network": {"latency_ms": 5.0, "round_s": 1.0}, "config": LORA,
                          "variants": [{"name": "2/2", "config": {"share": {"local_groups": 2,
                                                                             "external_groups": 2}}}],
                          "node": [{"index": i, "model": str(warm_tiny_model_dir)} for i in range(3)]}, "lora")
    result = run_cell(scn, scn.variants[0], 0, tmp_path)
    cell = tmp_path / "2-2" / "seed0"
    rows = list(csv.DictReader(open(cell / "metrics.csv")))
    assert [(r["node"], r["round"]) for r in rows] == [(str(n), str(r)) for r in (1, 2) for n in range(3)]
    assert all(r["received"] == "4" for r in rows)  # 2 groups from each of the 2 other nodes, every round
    assert len(result["final_eval_acc_per_node"]) == 3
    updates = [sum(int(r["groups_used"]) + int(r["external_used"]) > 0 for r in rows if r["node"] == str(i))
               for i in range(3)]
    assert sum(updates) > 0 and sum(int(r["external_used"]) for r in rows) > 0
    for i in range(3):
        # Each node's adapter, as of its last update, is on disk in peft's layout; older versions are gone.
        adapters = cell / "adapters" / f"node{i}"
        versions = sorted(p.name for p in adapters.iterdir()) if adapters.exists() else []
        assert versions == ([f"v{updates[i]}"] if updates[i] else [])
        for v in versions:
            assert json.loads((adapters / v / "adapter_config.json").read_text())["r"] == 4
