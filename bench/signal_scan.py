"""Which groups carry signal before any training: the design input of bench.sapo_regimes' candidates (issue 30 item 5).

For each option set of `OPTION_SETS` (the default mix's four and harder and easier ones of the same specialties) and
each G of `--group-sizes`: `--problems` TRAINING problems (never held out), G completions each from the embedded
default model at its own sampling (temperature and top-p from its generation_config.json, the node's defaults), the
node's reward (correctness, exact). `no_signal_frac`: the share of groups whose completions all scored alike (no
GRPO gradient); `reward_mean`; `binomial_no_signal`: p^G + (1 - p)^G at the mean pass rate p, what the fraction
would be if every question had the same pass rate (the gap measures how bimodal the per-question pass rates are).
Writes bench/results/signal_scan.json (keeping the scans of other option sets and G from an earlier run) and prints
one line per option set and G.

    python -m bench.signal_scan [--problems 64] [--group-sizes 8 16 32] [--sets chain_sum/2-3t ...] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from bench import provenance
from swarm_node import tasks
from swarm_node.config import load_config
from swarm_node.node.assembly import assemble
from swarm_node.node.run_files import NodeEvents
from swarm_node.sampler.base import SamplingParams

RESULTS = Path(__file__).parent / "results"
_NO_NEGATIVES = {"allow_parentheses": False, "allow_negation": False}
OPTION_SETS: dict[str, dict[str, Any]] = {  # name -> a mix entry; "*" marks the default mix's own option sets
    "chain_sum/2t-1-2d": {"name": "chain_sum", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                           "max_digits": 2}},
    "chain_sum/2-3t-1-2d*": {"name": "chain_sum", "options": {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                                              "max_digits": 2}},
    "chain_sum/3-4t-1-2d": {"name": "chain_sum", "options": {"min_terms": 3, "max_terms": 4, "min_digits": 1,
                                                             "max_digits": 2}},
    "basic_arithmetic/2t-2d+-": {"name": "basic_arithmetic", "options": {
        "min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": ["+", "-"], **_NO_NEGATIVES}},
    "basic_arithmetic/2t-2d*": {"name": "basic_arithmetic", "options": {
        "min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": ["+", "-", "*"],
        **_NO_NEGATIVES}},
    "basic_arithmetic/2-3t-2d": {"name": "basic_arithmetic", "options": {
        "min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 2, "operators": ["+", "-", "*"],
        **_NO_NEGATIVES}},
    "gcd/1-300": {"name": "gcd", "options": {"min_value": 1, "max_value": 300}},
    "gcd/1-1000*": {"name": "gcd", "options": {"min_value": 1, "max_value": 1000}},
    "gcd/1-10000": {"name": "gcd", "options": {"min_value": 1, "max_value": 10000}},
    "count_bits/1-4095": {"name": "count_bits", "options": {"min_n": 1, "max_n": 4095}},
    "count_bits/1-65535*": {"name": "count_bits", "options": {"min_n": 1, "max_n": 65535}},
    "count_bits/1-1048575": {"name": "count_bits", "options": {"min_n": 1, "max_n": 1048575}},
}


def group_stats(rewards: list[list[float]]) -> dict[str, float]:
    """A scan's figures from each problem's G rewards (pure: tested with hand-computed values)."""
    flat = [r for group in rewards for r in group]
    p = sum(flat) / len(flat)
    g = len(rewards[0])
    return {"no_signal_frac": sum(len(set(group)) == 1 for group in rewards) / len(rewards), "reward_mean": p,
            "binomial_no_signal": p ** g + (1 - p) ** g}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=64, help="training problems per option set [%(default)s]")
    ap.add_argument("--group-sizes", type=int, nargs="+", default=[8], help="[8]")
    ap.add_argument("--sets", nargs="+", choices=list(OPTION_SETS), help="only these option sets")
    ap.add_argument("--seed", type=int, default=1, help="the draw of training problems [%(default)s]")
    ap.add_argument("--out", type=Path, default=RESULTS / "signal_scan.json")
    args = ap.parse_args(argv)
    run = provenance.begin()  # rewards and fractions: not timed
    with tempfile.TemporaryDirectory() as scratch:
        cfg = load_config(None, {"run.steps": 1, "run.run_dir": scratch, "run.eval_problems": 0, "status.port": -1})
        assembly = assemble(cfg, events=NodeEvents(log=lambda line: None, on_step=lambda m: None))
        node = assembly.node
        assert node.sampler is not None
        temperature, top_p = node.cfg.sampler.temperature_top_p()
        params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=node.cfg.sampler.max_new_tokens)
        earlier = json.loads(args.out.read_text()) if args.out.exists() else {}
        scans: dict[str, dict[str, Any]] = earlier.get("scans", {})
        for name in args.sets or list(OPTION_SETS):
            source = load_config(None, {"task.mix": [OPTION_SETS[name]]}).task.build_source()
            insts = [tasks.instance(r) for r in source.draw(random.Random(args.seed), args.problems)]
            prompts = [node.prompter.ids(i) for i in insts]
            for g in args.group_sizes:
                outs = node.sampler.generate(prompts, g, params)
                rewards = [[source.reward(inst, c.text, node.prompter.fmt) for c in group]
                           for inst, group in zip(insts, outs, strict=True)]
                stats = group_stats(rewards)
                scans.setdefault(name, {})[str(g)] = stats
                print(f"signal_scan: {name} G {g}: no signal {stats['no_signal_frac']:.3f} (binomial "
                      f"{stats['binomial_no_signal']:.3f} at the mean reward {stats['reward_mean']:.3f})", flush=True)
        assembly.close()
    result = {"option_sets": {n: OPTION_SETS[n] for n in scans}, "scans": scans, "problems": args.problems,
              "seed": args.seed, "temperature": temperature, "top_p": top_p,
              "max_new_tokens": node.cfg.sampler.max_new_tokens}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(provenance.stamp(result, run, runs=1), indent=1) + "\n")


if __name__ == "__main__":
    main()
