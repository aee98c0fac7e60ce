"""The embedded model's recipe, measured: its build time, and its greedy completions on a split of the mix (well-formed
share, accuracy per specialty, completion lengths), so that a recipe's settings are chosen on validation problems and
reported on test problems.

    python -m bench.default_model [--recipe bpe-think-answer-v2] [--set warmup_steps=400 ...]
                                  [--split validation|test] [--problems 400] [--threads 2] [--loaded]

Builds the recipe (with the --set changes) into a scratch directory (never the cache) with `--threads` torch
threads (a node uses all cores: 2 here), times it, loads it as a node does and generates greedy at the recipe's own
budget (`max_new_tokens`), prompted in the model's own format (`build_prompter("")`). Splits: `validation` (hash
buckets 15..19, `tasks.SPLITS["validation"]`, from an index stream of its own, distinct questions) and `test`
(the held-out eval stream of a node with task seed 0, `TaskSource.eval_refs`). It also measures the longest
think-answer trace, in the model's tokens with its EOS, of `TRACE_PROBLEMS` training problems per specialty: the
budget must hold it. Appends one row to bench/results/default_model.json and prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench import provenance
from bench.load_guard import add_loaded_flag
from swarm_node import tasks
from swarm_node.model.default_model import load_model
from swarm_node.model.prompting import build_prompter
from swarm_node.model.recipes import DEFAULT_RECIPE, MODEL_RECIPES
from swarm_node.model.think_recipe import in_validation
from swarm_node.model.tokenizer import eos_ids
from swarm_node.sampler.base import SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.tasks.traces import think_answer_completion
from swarm_node.train.step_metrics import percentile

RESULTS = Path(__file__).parent / "results"
VALIDATION_SEED = 2_000_003  # the validation stream's own seed: neither training (task seeds) nor test draws
TRACE_PROBLEMS = 1000
BATCH = 50


def with_settings(name: str, settings: list[str]) -> Any:
    recipe = MODEL_RECIPES[name]
    fields = {f.name: f for f in dataclasses.fields(recipe)}
    changes: dict[str, Any] = {}
    for item in settings:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"error: recipe {name!r} has no setting {key!r}; it has {', '.join(fields)}")
        changes[key] = type(getattr(recipe, key))(value)
    return dataclasses.replace(recipe, **changes)


def validation_problems(source: tasks.TaskSource, count: int) -> list[tasks.TaskInstance]:
    """`count` distinct validation questions, spread evenly over the mix."""
    out: list[tasks.TaskInstance] = []
    for j, spec in enumerate(source.mix):
        want, seen, index = count // len(source.mix) + (j < count % len(source.mix)), set(), 0
        while len(seen) < want:
            inst = tasks.instance(tasks.TaskRef(spec.name, spec.config, VALIDATION_SEED, index))
            index += 1
            if in_validation(inst) and inst.question not in seen:
                seen.add(inst.question)
                out.append(inst)
    return out


def longest_trace(mix: Any, tokenizer: Any) -> dict[str, int]:
    """The most tokens (EOS included) of a think-answer completion of a training problem, per specialty."""
    longest: dict[str, int] = {}
    source = tasks.TaskSource(seed=5, selection="balanced", mix=mix)
    for ref in source.draw(random.Random(7), TRACE_PROBLEMS * len(source.mix)):
        ids = tokenizer.encode(think_answer_completion(tasks.instance(ref)), add_special_tokens=False)
        longest[ref.dataset] = max(longest.get(ref.dataset, 0), len(ids) + 1)
    return longest


def measure(model_dir: Path, insts: list[tasks.TaskInstance], budget: int, mix: Any) -> dict[str, Any]:
    model, tokenizer = load_model(model_dir)
    prompter = build_prompter("", tokenizer, budget)
    eos = eos_ids(tokenizer, getattr(model.generation_config, "eos_token_id", None))
    special = frozenset(tokenizer.all_special_ids)
    sampler = HFSampler(model, tokenizer)
    rows: dict[str, list[tuple[bool, bool, int, bool]]] = {}
    started = time.monotonic()
    for start in range(0, len(insts), BATCH):
        chunk = insts[start:start + BATCH]
        outs = sampler.generate([prompter.ids(i) for i in chunk], 1, SamplingParams(temperature=0.0,
                                                                                     max_new_tokens=budget))
        for inst, (c,) in zip(chunk, outs, strict=True):
            formed = prompter.fmt.well_formed(c.token_ids, c.text, eos, special)
            right = formed and tasks.score(inst, c.text, prompter.fmt) >= 1.0
            cut = not c.token_ids or c.token_ids[-1] not in eos
            rows.setdefault(inst.ref.dataset, []).append((formed, right, len(c.token_ids), cut))
    every = [r for rs in rows.values() for r in rs]

    def summary(rs: list[tuple[bool, bool, int, bool]]) -> dict[str, Any]:
        lengths = [r[2] for r in rs]
        def share(i: int) -> float:
            return round(sum(r[i] for r in rs) / len(rs), 4)

        return {"problems": len(rs), "well_formed": share(0), "accuracy": share(1), "cut": share(3),
                "tokens_p50": percentile(lengths, 50), "tokens_p95": percentile(lengths, 95),
                "tokens_max": max(lengths)}

    return {"format": prompter.name, "eval_s": round(time.monotonic() - started, 1), **summary(every),
            "per_specialty": {name: summary(rs) for name, rs in sorted(rows.items())},
            "longest_trace": longest_trace(mix, tokenizer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, choices=list(MODEL_RECIPES))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--problems", type=int, default=400)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", type=Path, help="also copy the built model directory here")
    parser.add_argument("--model-dir", type=Path, help="measure this built directory of the recipe (no build)")
    add_loaded_flag(parser)
    args = parser.parse_args()
    run = provenance.begin(timed=True, loaded=args.loaded)  # build seconds
    torch.set_num_threads(args.threads)
    recipe = with_settings(args.recipe, args.set)
    mix = recipe.task_mix()
    source = tasks.TaskSource(seed=0, selection="balanced", mix=mix)
    insts = (validation_problems(source, args.problems) if args.split == "validation"
             else [tasks.instance(r) for r in source.eval_refs(args.problems)])
    if args.model_dir:
        facts = json.loads((args.model_dir / "swarm_node_recipe.json").read_text())
        build_s = float(facts["build_seconds"])
        result = measure(args.model_dir, insts, int(facts["max_new_tokens"]), mix)
    else:
        build_s, result = build_and_measure(recipe, args.keep, insts, mix)
    row = {"recipe": args.recipe, "settings": args.set, "split": args.split, "threads": args.threads,
           "build_s": round(build_s, 1), "load_avg_1m": round(os.getloadavg()[0], 2),
           "model_dir": str(args.model_dir or ""), **result}
    out = RESULTS / "default_model.json"
    rows = json.loads(out.read_text()).get("rows", []) if out.exists() else []
    out.write_text(json.dumps(provenance.stamp({"rows": [*rows, row]}, run, len(rows) + 1), indent=1) + "\n")
    print(json.dumps(row))


def build_and_measure(recipe: Any, keep: Path | None, insts: list[tasks.TaskInstance], mix: Any
                      ) -> tuple[float, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        path.mkdir()
        started = time.monotonic()

        def progress(step: int, total: int, note: str) -> None:
            if step % 50 == 0 or step == total:
                print(f"  step {step}/{total} {note} {time.monotonic() - started:.0f}s", flush=True)

        recipe.build(path, progress)
        build_s = time.monotonic() - started
        if keep:
            shutil.copytree(path, keep, dirs_exist_ok=True)
        return build_s, measure(path, insts, recipe.facts()["max_new_tokens"], mix)


if __name__ == "__main__":
    main()
