"""Fuzz the wire decoder: random and mutated inputs must only ever raise `WireError`, and never hang.

Run: `python -m bench.fuzz_wire [--inputs N] [--seed S]`. Writes bench/results/fuzz_wire.json with
{"inputs", "crashes", "inputs_per_s", ...} and prints one summary line. A crash is any exception other than
WireError, or an input that takes longer than the per-input time guard (SIGALRM). Inputs are a seeded mix of:
random bytes, byte-level mutations of valid messages (bit flips, interesting bytes, insertions, deletions,
duplicated slices, truncation), splices of two valid messages, schema-level mutations (a field replaced by any
msgpack value, deleted, or a key added) and random msgpack objects in a valid envelope, plus the valid messages
themselves. Side by side, the same inputs go through plain `msgpack.unpackb` (no limits, no schema) as a
baseline for what validation costs: batch by batch, each batch decoded then parsed by the baseline, so
`paired_ratio_decode_over_unpackb` is the median of the per-batch ratios of the two rates (`bench/paired.py`),
each batch's in `batch_ratios_decode_over_unpackb`. It reports rates, so it refuses to start when the 1-minute
load average is above 0.5 unless --loaded.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from bench import provenance
from bench.load_guard import add_loaded_flag
from bench.paired import paired_ratio_or_none, per_run_ratios
from protocol.codec import decode, encode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import (
    ROLES,
    TYPE_TAGS,
    CompletionWire,
    Message,
    PolicyAnnounce,
    RolloutBatch,
    RolloutGroup,
    Status,
    TaskRefWire,
)

RESULTS = Path(__file__).resolve().parent / "results" / "fuzz_wire.json"
NOW = 1_700_000_000.0
# Smaller than the defaults so that random inputs reach every limit, not only the schema checks.
LIMITS = Limits(max_message_bytes=64 * 1024, max_groups_per_message=4, max_completions_per_group=8,
                max_tokens_per_completion=128, max_text_chars=512, vocab_size=50_000, max_name_chars=64,
                max_config_chars=256, max_capabilities=8)
HANG_S = 1.0
BATCH = 5_000
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_CHAR_RANGES = ((0x20, 0x7E), (0xA0, 0x2FF), (0x4E00, 0x4E50), (0x1F600, 0x1F64F))
_INTERESTING_INTS = (0, 1, -1, 127, 128, 255, 256, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63))
_INTERESTING_FLOATS = (float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324, 1e11 + 1, NOW, -1.0)
_INTERESTING_BYTES = (0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xC4, 0xC5, 0xC6, 0xC7,
                      0xCA, 0xCB, 0xCC, 0xCF, 0xD3, 0xD4, 0xD8, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0,
                      0xFF)


class _Hang(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang


# ------------------------------------------------------------------------------------------- valid messages


def _text(rng: random.Random, max_len: int) -> str:
    low, high = rng.choice(_CHAR_RANGES)
    return "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(0, max_len)))


def _policy_id(rng: random.Random) -> str:
    peer = "12D3KooW" + "".join(rng.choice(_BASE58) for _ in range(rng.randint(1, 44)))
    return peer if rng.random() < 0.5 else f"{peer}/lora-{rng.randint(0, 99)}"


def _completion(rng: random.Random) -> CompletionWire:
    n = rng.randint(0, 64)
    return CompletionWire(tuple(rng.randrange(LIMITS.vocab_size) for _ in range(n)), _text(rng, 80),
                          tuple(-rng.expovariate(1.0) for _ in range(n)), rng.choice((0.0, 1.0, rng.random())))


def _group(rng: random.Random) -> RolloutGroup:
    return RolloutGroup(rng.randbytes(16), _policy_id(rng), rng.randint(0, 1000),
                        TaskRefWire("chain_sum", '{"max_digits":2,"max_terms":2}', rng.randint(0, 5),
                                    rng.randrange(1_000_000)),
                        tuple(_completion(rng) for _ in range(rng.randint(1, 4))), "sha256:" + rng.randbytes(8).hex(),
                        "qwen2", NOW - rng.uniform(0, 500))


def valid_message(rng: random.Random) -> Message:
    kind = rng.random()
    if kind < 0.6:
        return RolloutBatch(tuple(_group(rng) for _ in range(rng.randint(1, 3))))
    if kind < 0.8:
        version = rng.randint(1, 10_000)
        size = rng.randint(1, 10**9)
        return PolicyAnnounce(_policy_id(rng), version, rng.randint(0, version), size, rng.randbytes(32),
                              rng.randint(1, min(size, 4096)), "dense-bf16", NOW - rng.uniform(-20, 500))
    return Status(rng.choice(ROLES), tuple(rng.choice(("rollouts", "relay", "deltas")) for _ in range(3)),
                  rng.uniform(0, 1e4), rng.randint(0, 1000), rng.choice(("", _policy_id(rng))),
                  NOW - rng.uniform(-20, 500))


# ------------------------------------------------------------------------------------------------ mutators


def random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 6))]
    if depth < 3 and roll < 0.3:
        return {_text(rng, 10): random_value(rng, depth + 1) for _ in range(rng.randint(0, 6))}
    return rng.choice((
        lambda: None, lambda: rng.random() < 0.5, lambda: rng.choice(_INTERESTING_INTS),
        lambda: rng.randint(-(2**63), 2**64 - 1), lambda: rng.choice(_INTERESTING_FLOATS),
        lambda: rng.uniform(-1e12, 1e12), lambda: _text(rng, 40), lambda: rng.randbytes(rng.randint(0, 40)),
        lambda: "x" * rng.choice((0, 64, 65, 129, 513, 2049)), lambda: bytes(rng.choice((0, 4, 15, 16, 31, 32, 516))),
        lambda: msgpack.ExtType(rng.randint(0, 127), rng.randbytes(rng.randint(0, 4))),
    ))()


def same_type_mutation(rng: random.Random, value: Any) -> Any:
    """A value of the same msgpack type that probes a range or limit: flipped blob bits keep the blob's length
    (vocabulary, log-prob sign and NaN checks), boundary numbers, over-long strings."""
    if isinstance(value, bytes) and value:
        raw = bytearray(value)
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return min(max(rng.choice(_INTERESTING_INTS + (value + 1, value - 1)), -(2**63)), 2**64 - 1)
    if isinstance(value, float):
        return rng.choice(_INTERESTING_FLOATS)
    if isinstance(value, str):
        return value * rng.randint(2, 40) if value else "x" * rng.choice((65, 257, 513))
    return random_value(rng)


def value_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path into a nested msgpack value (the root is the empty path)."""
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += value_paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += value_paths(value, (*prefix, i))
    return out


def schema_mutation(rng: random.Random, data: bytes) -> bytes:
    obj = msgpack.unpackb(data, raw=False)
    for _ in range(rng.randint(1, 3)):
        paths = value_paths(obj)[1:]
        if not paths:
            break
        path = rng.choice(paths)
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        roll = rng.random()
        if roll < 0.2 and isinstance(parent, dict):
            del parent[path[-1]]
        elif roll < 0.3 and isinstance(parent, dict):
            parent[_text(rng, 8) or "extra"] = random_value(rng)
        elif roll < 0.4 and isinstance(parent, list):
            parent.append(rng.choice(parent))  # e.g. a duplicate group or one completion too many
        elif roll < 0.7:
            parent[path[-1]] = same_type_mutation(rng, parent[path[-1]])
        else:
            parent[path[-1]] = random_value(rng)
    return msgpack.packb(obj, use_bin_type=True)


def byte_mutation(rng: random.Random, data: bytes) -> bytes:
    raw = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(len(raw)) if raw else 0
        roll = rng.random()
        if roll < 0.35 and raw:
            raw[pos] ^= 1 << rng.randrange(8)
        elif roll < 0.6 and raw:
            raw[pos] = rng.choice(_INTERESTING_BYTES)
        elif roll < 0.7:
            raw[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif roll < 0.8:
            del raw[pos:pos + rng.randint(1, 16)]
        elif roll < 0.9 and raw:
            end = min(len(raw), pos + rng.randint(1, 64))
            raw[pos:pos] = raw[pos:end]
        else:
            del raw[pos:]
    return bytes(raw)


def make_input(rng: random.Random, corpus: list[bytes]) -> tuple[str, bytes]:
    roll = rng.random()
    if roll < 0.15:
        return "random_bytes", rng.randbytes(rng.randint(0, 600))
    if roll < 0.20:
        return "random_prefixed", bytes([rng.choice((0x81, 0x83, 0xDE, 0xDF))]) + rng.randbytes(rng.randint(0, 300))
    if roll < 0.55:
        return "byte_mutation", byte_mutation(rng, rng.choice(corpus))
    if roll < 0.65:
        a, b = rng.choice(corpus), rng.choice(corpus)
        return "splice", a[:rng.randint(0, len(a))] + b[rng.randint(0, len(b)):]
    if roll < 0.88:
        return "schema_mutation", schema_mutation(rng, rng.choice(corpus))
    if roll < 0.97:
        envelope = {"v": rng.choice((1, 1, 1, 2, -1, 2**64 - 1)), "type": rng.choice(sorted(TYPE_TAGS.values())),
                    "body": random_value(rng)}
        return "random_object", msgpack.packb(envelope, use_bin_type=True)
    return "valid", rng.choice(corpus)


# ---------------------------------------------------------------------------------------------------- runner


def _baseline(data: bytes) -> None:
    try:
        msgpack.unpackb(data, raw=False)
    except Exception:  # the baseline only measures the cost of parsing, any outcome is fine
        pass


def run(inputs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    corpus = [encode(valid_message(rng)) for _ in range(300)]
    outcomes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    generators: Counter[str] = Counter()
    crash_examples: list[dict[str, str]] = []
    crashes = hangs = 0
    decode_s = baseline_s = max_input_s = 0.0
    batch_rates: list[float] = []
    baseline_rates: list[float] = []
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        done = 0
        while done < inputs:
            batch = [make_input(rng, corpus) for _ in range(min(BATCH, inputs - done))]
            batch_start = time.perf_counter()
            for generator, data in batch:
                generators[generator] += 1
                start = time.perf_counter()
                signal.setitimer(signal.ITIMER_REAL, HANG_S)
                try:
                    decode(data, LIMITS, NOW)
                    outcomes["accept"] += 1
                except WireError as err:
                    outcomes[err.verdict.value] += 1
                    reasons[err.reason] += 1
                except _Hang:
                    hangs += 1
                except Exception as exc:  # anything but WireError is exactly what we count
                    crashes += 1
                    if len(crash_examples) < 5:
                        crash_examples.append({"error": repr(exc)[:300], "input_hex": data[:200].hex()})
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                max_input_s = max(max_input_s, time.perf_counter() - start)
            elapsed = time.perf_counter() - batch_start
            decode_s += elapsed
            batch_rates.append(len(batch) / elapsed)
            start = time.perf_counter()
            for _, data in batch:
                _baseline(data)
            baseline_elapsed = time.perf_counter() - start
            baseline_s += baseline_elapsed
            baseline_rates.append(len(batch) / baseline_elapsed)
            done += len(batch)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return {
        "inputs": inputs, "crashes": crashes + hangs, "inputs_per_s": round(inputs / decode_s, 1),
        "hangs": hangs, "exceptions": crashes, "seed": seed, "hang_guard_s": HANG_S,
        "inputs_per_s_median_batch": round(statistics.median(batch_rates), 1),
        "baseline_unpackb_inputs_per_s": round(inputs / baseline_s, 1),
        "paired_ratio_decode_over_unpackb": _rounded(paired_ratio_or_none(batch_rates, baseline_rates)),
        "batch_ratios_decode_over_unpackb": [round(r, 4) for r in per_run_ratios(batch_rates, baseline_rates)],
        "max_input_ms": round(max_input_s * 1000, 3),
        "verdicts": dict(outcomes), "reasons": dict(reasons.most_common()), "generators": dict(generators),
        "crash_examples": crash_examples,
    }


def _rounded(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio, 4)


def main(argv: list[str] | None = None, run_fn: Callable[[int, int], dict[str, Any]] = run) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_loaded_flag(parser)
    args = parser.parse_args(argv)
    started = provenance.begin(timed=True, loaded=args.loaded)  # inputs/s
    result = provenance.stamp(run_fn(args.inputs, args.seed), started, runs=None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"fuzz_wire: {result['inputs']} inputs, {result['crashes']} crashes ({result['hangs']} hangs), "
          f"{result['inputs_per_s']:.0f} inputs/s (plain msgpack.unpackb: "
          f"{result['baseline_unpackb_inputs_per_s']:.0f}/s), max {result['max_input_ms']:.1f} ms/input, "
          f"verdicts {result['verdicts']}")
    return result


if __name__ == "__main__":
    main()
