"""Sampler throughput and weight-sync latency: our vLLM sampler vs raw `LLM.generate` vs the native and the
transformers samplers.

In one run, on the same prompts (64 default-task prompts x 8 samples, up to 64 new tokens, temperature 1, top-p 1,
stop at EOS) and for two models, the char-answer-line-v1 one and a larger random one (~23M parameters): tokens/s of
  ours     VLLMSampler.generate (processed log-probs, conversion to Completions, text),
  raw      LLM.generate on the same engine with the same sampling settings and no log-probs,
  native   NativeSampler.generate (its own decoding loop: auto's fallback for Qwen2/Llama models),
  hf       HFSampler.generate (transformers `generate` with scores: the reference),
each the median of `--runs` rounds; the four are interleaved within each round, so the paired ratios
`paired_ratio_ours_over_raw`, `paired_ratio_ours_over_hf` and `paired_ratio_native_over_hf` are the medians of the
per-round ratios (each round's values in `models[i].runs[j]`); and the median latency of VLLMSampler.load_weights
(reload + prefix-cache reset). Tokens are those actually generated (EOS ends a completion early), divided by wall
time. `reasoning_default`: the embedded default (bpe-think-answer-v2, head size 16: no vLLM CPU kernel) as a node
samples it, 32 prompts of its mix x 8 at its own temperature, top-p and budget (0.7, 0.8, 192), native against
transformers, interleaved the same way. Writes bench/results/sampler.json and prints one summary line.

    python -m bench.sampler [--runs 3] [--prompts 64] [--samples 8] [--max-new-tokens 64] [--loaded]

It reports rates, so it refuses to start when the 1-minute load average is above 0.5 unless --loaded.
"""

from __future__ import annotations

import os

# OpenMP reads its wait policy once, when torch loads it: passive waiting keeps 2 threads from collapsing when the
# cores are shared (see swarm_node.sampler.vllm_sampler). Then vLLM's environment, before anything imports vllm.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from swarm_node.sampler.vllm_sampler import VLLMSampler, usable_cores  # isort: skip

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import vllm
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from vllm.inputs import TokensPrompt

from bench import provenance
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratio
from swarm_node import tasks
from swarm_node.model.char_recipe import CharRecipe, random_qwen2
from swarm_node.model.default_model import ensure_default_model, load_model, model_dir, own_budget
from swarm_node.model.prompting import build_prompter
from swarm_node.model.recipe_mixes import REASONING_MIX
from swarm_node.model.recipes import DEFAULT_RECIPE
from swarm_node.model.tokenizer import build_char_tokenizer
from swarm_node.sampler.base import SamplerSettings, SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.sampler.native import NativeSampler

RESULTS = Path(__file__).parent / "results"
REASONING_PROMPTS, REASONING_SAMPLES = 32, 8  # one step of the default node: run.prompts_per_step x G
LARGE_RECIPE = CharRecipe(hidden_size=512, layers=8, heads=8, kv_heads=2, intermediate_size=1408, max_positions=256)
WEIGHT_SYNC_REPEATS = 5


def default_model(tmp: Path) -> tuple[str, PreTrainedModel, PreTrainedTokenizerBase, Path]:
    """The built char-answer-line-v1 model (the default until November 2026, kept so that results compare) when the
    cache has it; else its shape with random weights (same speed)."""
    built = model_dir("char-answer-line-v1")
    if (built / "config.json").exists():
        model, tokenizer = load_model(built)
        return "default", model, tokenizer, built
    return random_model("default-shape-random", CharRecipe(), tmp)


def random_model(name: str, recipe: CharRecipe, tmp: Path
                 ) -> tuple[str, PreTrainedModel, PreTrainedTokenizerBase, Path]:
    tokenizer = build_char_tokenizer()
    model = random_qwen2(tokenizer, recipe, seed=0).eval()
    path = tmp / name
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return name, model, tokenizer, path


def timed(fn: Callable[[], int]) -> float:
    """tokens/s of one call that returns its generated token count."""
    started = time.perf_counter()
    tokens = fn()
    return tokens / (time.perf_counter() - started)


def run_values(rates: dict[str, list[float]]) -> list[dict[str, float]]:
    """Each round's tokens/s of ours, raw vLLM, native and transformers, and its ratios."""
    ours, raw, native, hf = rates["ours"], rates["raw"], rates["native"], rates["hf"]
    return [{"ours_tok_s": round(o, 1), "raw_vllm_tok_s": round(r, 1), "native_tok_s": round(n, 1),
             "hf_tok_s": round(h, 1), "ratio_ours_over_raw": round(o / r, 4), "ratio_ours_over_hf": round(o / h, 4),
             "ratio_native_over_hf": round(n / h, 4)}
            for o, r, n, h in zip(ours, raw, native, hf, strict=True)]


def interleaved(name: str, order: list[tuple[str, Callable[[], int]]], runs: int) -> dict[str, list[float]]:
    """tokens/s of each arm, `runs` rounds; who goes first rotates (load drifts during a run)."""
    rates: dict[str, list[float]] = {key: [] for key, _ in order}
    with torch.no_grad():
        for i in range(runs):
            shift = i % len(order)
            for key, fn in order[shift:] + order[:shift]:
                rates[key].append(timed(fn))
            print(f"  {name} run {i + 1}/{runs}: " + ", ".join(f"{k} {v[-1]:,.0f} tok/s" for k, v in rates.items()),
                  flush=True)
    return rates


def tokens_of(sampler: HFSampler, prompts: list[list[int]], samples: int, params: SamplingParams) -> Callable[[], int]:
    return lambda: sum(len(c.token_ids) for g in sampler.generate(prompts, samples, params) for c in g)


def bench_model(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path,
                prompts: list[list[int]], samples: int, params: SamplingParams, runs: int) -> dict[str, Any]:
    started = time.perf_counter()
    ours = VLLMSampler(path, tokenizer, SamplerSettings(), version=0)
    engine_start_s = time.perf_counter() - started
    hf, native = HFSampler(model, tokenizer, version=0), NativeSampler(model, tokenizer, version=0)
    raw_params = vllm.SamplingParams(n=samples, temperature=params.temperature, top_p=params.top_p, top_k=0,
                                     max_tokens=params.max_new_tokens, stop_token_ids=[tokenizer.eos_token_id],
                                     detokenize=False)
    raw_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    # Each timed vLLM call starts from an empty prefix cache, as an RL step does (new prompts every step): else the
    # second of two calls on the same prompts would find their prefill done.
    def run_ours() -> int:
        ours.llm.reset_prefix_cache()
        return sum(len(c.token_ids) for g in ours.generate(prompts, samples, params) for c in g)

    def run_raw() -> int:
        ours.llm.reset_prefix_cache()
        outs = ours.llm.generate(raw_prompts, raw_params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    rates = interleaved(name, [("ours", run_ours), ("raw", run_raw),
                               ("native", tokens_of(native, prompts, samples, params)),
                               ("hf", tokens_of(hf, prompts, samples, params))], runs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    sync_ms = []
    for version in range(1, WEIGHT_SYNC_REPEATS + 1):
        started = time.perf_counter()
        ours.load_weights(state, version)
        sync_ms.append((time.perf_counter() - started) * 1000)
    ours.close()
    return {"name": name, "params": sum(p.numel() for p in model.parameters()),
            "ours_tok_s": round(statistics.median(rates["ours"]), 1),
            "raw_vllm_tok_s": round(statistics.median(rates["raw"]), 1),
            "native_tok_s": round(statistics.median(rates["native"]), 1),
            "hf_tok_s": round(statistics.median(rates["hf"]), 1),
            "paired_ratio_ours_over_raw": round(paired_ratio(rates["ours"], rates["raw"]), 4),
            "paired_ratio_ours_over_hf": round(paired_ratio(rates["ours"], rates["hf"]), 4),
            "paired_ratio_native_over_hf": round(paired_ratio(rates["native"], rates["hf"]), 4),
            "runs": run_values(rates),
            "weight_sync_ms": round(statistics.median(sync_ms), 2),
            "engine_start_s": round(engine_start_s, 2)}


def bench_reasoning_default(runs: int) -> dict[str, Any]:
    """The embedded default as a node samples it: native against transformers (vLLM cannot run head size 16)."""
    path = ensure_default_model()
    model, tokenizer = load_model(path)
    budget = own_budget(path) or 192
    generation = model.generation_config
    params = SamplingParams(temperature=generation.temperature, top_p=generation.top_p, max_new_tokens=budget)
    source = tasks.TaskSource(mix=REASONING_MIX)
    prompter = build_prompter("", tokenizer, budget)
    prompts = [prompter.ids(tasks.instance(ref)) for ref in source.draw(random.Random(0), REASONING_PROMPTS)]
    native, hf = NativeSampler(model, tokenizer), HFSampler(model, tokenizer)
    rates = interleaved("reasoning default", [("native", tokens_of(native, prompts, REASONING_SAMPLES, params)),
                                              ("hf", tokens_of(hf, prompts, REASONING_SAMPLES, params))], runs)
    return {"name": DEFAULT_RECIPE, "params": sum(p.numel() for p in model.parameters()),
            "prompts": REASONING_PROMPTS, "samples": REASONING_SAMPLES, "temperature": params.temperature,
            "top_p": params.top_p, "max_new_tokens": budget,
            "native_tok_s": round(statistics.median(rates["native"]), 1),
            "hf_tok_s": round(statistics.median(rates["hf"]), 1),
            "paired_ratio_native_over_hf": round(paired_ratio(rates["native"], rates["hf"]), 4),
            "runs": [{"native_tok_s": round(n, 1), "hf_tok_s": round(h, 1), "ratio_native_over_hf": round(n / h, 4)}
                     for n, h in zip(rates["native"], rates["hf"], strict=True)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    add_loaded_flag(parser)
    args = parser.parse_args()
    run = provenance.begin(timed=True, loaded=args.loaded)
    torch.set_num_threads(usable_cores())  # the HF baseline gets the cores the vLLM sampler gets by default
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    source = tasks.TaskSource()  # one-digit chain_sum: its training draws (its test split holds only 32 questions)
    texts = [tasks.instance(ref).prompt for ref in source.draw(random.Random(0), args.prompts)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, tokenizer, path in (default_model(Path(tmp)),
                                             random_model("larger-random", LARGE_RECIPE, Path(tmp))):
            prompts = [tokenizer.encode(t) for t in texts]
            results.append(bench_model(name, model, tokenizer, path, prompts, args.samples, params, args.runs))
            print(f"  {json.dumps(results[-1])}", flush=True)
    reasoning = bench_reasoning_default(args.runs)
    print(f"  {json.dumps(reasoning)}", flush=True)
    out = {"runs": args.runs, "models": results, "reasoning_default": reasoning,
           "setup": {"prompts": args.prompts, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
                     "temperature": params.temperature, "top_p": params.top_p, "threads": usable_cores(),
                     "vllm": vllm.__version__, "dtype": "float32"}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sampler.json").write_text(json.dumps(provenance.stamp(out, run, args.runs), indent=1) + "\n")
    large = results[-1]
    print(f"sampler: {large['name']} ({large['params'] / 1e6:.1f}M params) ours {large['ours_tok_s']:,.0f} tok/s = "
          f"{large['paired_ratio_ours_over_raw']:.2f}x raw vLLM, "
          f"{large['paired_ratio_ours_over_hf']:.2f}x transformers (paired); "
          f"weight sync {large['weight_sync_ms']:.0f} ms; "
          + "; ".join(f"{r['name']} ours {r['ours_tok_s']:,.0f} / raw {r['raw_vllm_tok_s']:,.0f} / "
                      f"hf {r['hf_tok_s']:,.0f} tok/s, sync {r['weight_sync_ms']:.1f} ms" for r in results[:-1])
          + f"; reasoning default native {reasoning['native_tok_s']:,.0f} / hf {reasoning['hf_tok_s']:,.0f} tok/s "
            f"= {reasoning['paired_ratio_native_over_hf']:.2f}x (paired)")


if __name__ == "__main__":
    main()
