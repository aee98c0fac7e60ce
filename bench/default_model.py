"""The embedded model's recipe, measured: its build time, and its greedy completions on a split of the mix (well-formed
share, accuracy per specialty, completion lengths), so that a recipe's settings are chosen on validation problems and
reported on test problems.

    python -m bench.default_model [--recipe bpe-think-answer-v2] [--set warmup_steps=400 ...]
                                  [--split validation|test] [--problems 400] [--threads 2] [--loaded]
                                  [--device cpu|cuda|auto] [--variants FILE.json [--jobs N]] [--out PATH]

Builds the recipe (with the --set changes) into a scratch directory (never the cache) with `--threads` torch
threads (a node uses all cores: 2 here), the warm-up on `--device` (the directory is saved from the CPU: the same
layout wherever it was trained), times it, loads it as a node does and generates greedy at the recipe's own budget
(`max_new_tokens`) on that device, `--eval-batch` problems a `generate` call, prompted in the model's own format
(`build_prompter("")`). Splits (`tasks.SPLITS`): `validation` (hash buckets 15..19) or `test` (buckets 0..14), each
the distinct questions of a node's eval stream with task seed 0 (`TaskSource.eval_refs`). It also measures the
longest think-answer trace, in the model's tokens with its EOS, of `TRACE_PROBLEMS` training problems per specialty:
the budget must hold it. Appends one row to `--out` (bench/results/default_model.json) and prints it.

A sweep: `--variants FILE.json` is a list of `{"name": ..., "set": {FIELD: VALUE, ...}}`, each a variant of
`--recipe`, run one after another (or `--jobs N` at a time, each in its own process with `--threads` threads); each
variant's row is appended to `--out` as soon as it is done (bench/recipe_variants.json is the prepared sweep).
Imports neither vLLM nor libp2p: it runs where only torch and transformers are installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
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
from swarm_node.model.default_model import RECIPE_FILE, load_model
from swarm_node.model.device import Found, resolve_device
from swarm_node.model.prompting import build_prompter
from swarm_node.model.recipes import DEFAULT_RECIPE, MODEL_RECIPES
from swarm_node.model.tokenizer import eos_ids
from swarm_node.sampler.base import SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.tasks.traces import DEFAULT_TRACE_STYLE, think_answer_completion
from swarm_node.train.step_metrics import percentile

RESULTS = Path(__file__).parent / "results"
TRACE_PROBLEMS = 1000


@dataclasses.dataclass(frozen=True)
class Job:
    """One variant to build and measure (picklable: a `--jobs` worker process gets it)."""

    name: str
    recipe: str
    changes: dict[str, Any]
    split: str
    problems: int
    device: str
    threads: int
    eval_batch: int
    keep: Path | None = None
    model_dir: Path | None = None


def with_settings(name: str, changes: dict[str, Any]) -> Any:
    """Recipe `name` with `changes` (values cast to each field's type: "400" from the command line is 400)."""
    recipe = MODEL_RECIPES[name]
    fields = {f.name for f in dataclasses.fields(recipe)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise SystemExit(f"error: recipe {name!r} has no setting {unknown[0]!r}; it has {', '.join(sorted(fields))}")
    return dataclasses.replace(recipe, **{k: type(getattr(recipe, k))(v) for k, v in changes.items()})


def parse_settings(items: list[str]) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in items)


def load_variants(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """`[{"name": ..., "set": {...}}, ...]` -> (name, changes) pairs; names must be distinct."""
    variants = [(str(v["name"]), dict(v.get("set", {}))) for v in json.loads(path.read_text())]
    names = [name for name, _ in variants]
    if len(set(names)) != len(names):
        raise SystemExit(f"error: {path}: variant names repeat")
    return variants


def split_problems(mix: Any, split: str, count: int) -> list[tasks.TaskInstance]:
    """`count` distinct questions of `split`, spread evenly over the mix, from a node's eval stream (task seed 0)."""
    source = tasks.TaskSource(seed=0, selection="balanced", mix=mix)
    return [tasks.instance(ref) for ref in source.eval_refs(count, split)]


def longest_trace(mix: Any, tokenizer: Any, style: str) -> dict[str, int]:
    """The most tokens (EOS included) of a think-answer completion of a training problem, per specialty."""
    longest: dict[str, int] = {}
    source = tasks.TaskSource(seed=5, selection="balanced", mix=mix)
    for ref in source.draw(random.Random(7), TRACE_PROBLEMS * len(source.mix)):
        ids = tokenizer.encode(think_answer_completion(tasks.instance(ref), style), add_special_tokens=False)
        longest[ref.dataset] = max(longest.get(ref.dataset, 0), len(ids) + 1)
    return longest


def measure(model_dir: Path, insts: list[tasks.TaskInstance], budget: int, mix: Any, device: str, batch: int,
            style: str) -> dict[str, Any]:
    model, tokenizer = load_model(model_dir)
    prompter = build_prompter("", tokenizer, budget)
    eos = eos_ids(tokenizer, getattr(model.generation_config, "eos_token_id", None))
    special = frozenset(tokenizer.all_special_ids)
    sampler = HFSampler(model.to(device), tokenizer)
    rows: dict[str, list[tuple[bool, bool, int, bool]]] = {}
    started = time.monotonic()
    for start in range(0, len(insts), batch):
        chunk = insts[start:start + batch]
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
            "longest_trace": longest_trace(mix, tokenizer, style)}


def build_and_measure(recipe: Any, job: Job, insts: list[tasks.TaskInstance]) -> tuple[float, str, dict[str, Any]]:
    """Build seconds, the warm-up's last progress note (its loss), and the measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        path.mkdir()
        started = time.monotonic()
        last = [""]

        def progress(step: int, total: int, note: str) -> None:
            last[0] = note
            if step % 50 == 0 or step == total:
                print(f"  [{job.name}] step {step}/{total} {note} {time.monotonic() - started:.0f}s", flush=True)

        recipe.build(path, progress, device=job.device)
        build_s = time.monotonic() - started
        # as ensure_default_model writes it: a kept directory has the cache's layout and measures with --model-dir
        (path / RECIPE_FILE).write_text(json.dumps({**recipe.facts(), "build_seconds": round(build_s, 1)}, indent=1))
        if job.keep:
            shutil.copytree(path, job.keep, dirs_exist_ok=True)
        measured = measure(path, insts, recipe.facts()["max_new_tokens"], recipe.task_mix(), job.device,
                           job.eval_batch, getattr(recipe, "trace_style", DEFAULT_TRACE_STYLE))
        return build_s, last[0], measured


def run_job(job: Job) -> dict[str, Any]:
    """One variant's row (in a `--jobs` worker or in the main process)."""
    torch.set_num_threads(job.threads)
    recipe = with_settings(job.recipe, job.changes)
    insts = split_problems(recipe.task_mix(), job.split, job.problems)
    if job.model_dir:
        facts = json.loads((job.model_dir / "swarm_node_recipe.json").read_text())
        build_s, loss = float(facts["build_seconds"]), ""
        result = measure(job.model_dir, insts, int(facts["max_new_tokens"]), recipe.task_mix(), job.device,
                         job.eval_batch, str(facts.get("trace_style", DEFAULT_TRACE_STYLE)))
    else:
        build_s, loss, result = build_and_measure(recipe, job, insts)
    return {"variant": job.name, "recipe": job.recipe, "settings": job.changes, "split": job.split,
            "device": job.device, "device_name": torch.cuda.get_device_name(job.device) if "cuda" in job.device
            else "cpu", "threads": job.threads, "build_s": round(build_s, 1), "warmup_last": loss,
            "load_avg_1m": round(os.getloadavg()[0], 2), "model_dir": str(job.model_dir or ""), **result}


def append_row(out: Path, row: dict[str, Any], run: provenance.Run) -> None:
    rows = json.loads(out.read_text()).get("rows", []) if out.exists() else []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(provenance.stamp({"rows": [*rows, row]}, run, len(rows) + 1), indent=1) + "\n")
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, choices=list(MODEL_RECIPES))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--variants", type=Path, help="a JSON list of {name, set}: a sweep, one row per variant")
    parser.add_argument("--jobs", type=int, default=1, help="variants built at a time, each in its own process")
    parser.add_argument("--split", default="validation", choices=list(tasks.SPLITS))
    parser.add_argument("--problems", type=int, default=400)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--eval-batch", type=int, default=50, help="problems per generate call")
    parser.add_argument("--out", type=Path, default=RESULTS / "default_model.json")
    parser.add_argument("--keep", type=Path, help="also copy the built model directory here")
    parser.add_argument("--model-dir", type=Path, help="measure this built directory of the recipe (no build)")
    add_loaded_flag(parser)
    args = parser.parse_args()
    run = provenance.begin(timed=True, loaded=args.loaded)  # build seconds
    device = resolve_device(args.device, Found.probe())
    print(device.line, flush=True)
    variants = load_variants(args.variants) if args.variants else [("cli", parse_settings(args.set))]
    jobs = [Job(name, args.recipe, changes, args.split, args.problems, device.device, args.threads, args.eval_batch,
                args.keep, args.model_dir) for name, changes in variants]
    for job in jobs:
        with_settings(job.recipe, job.changes)  # an unknown setting stops the sweep before anything runs
    if args.jobs <= 1:
        for job in jobs:
            append_row(args.out, run_job(job), run)
        return
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap_unordered(run_job, jobs):
            append_row(args.out, row, run)


if __name__ == "__main__":
    main()
