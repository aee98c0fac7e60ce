"""The task mixes the embedded model recipes are warmed up on, pinned by value: a recipe's cache key and its
warm-up stream depend on its mix, so a change of the project's default mix must not change an existing recipe.

- `SMALL_MIX`: the mix of `char-answer-line-v1` (one-digit sums and products, gcd up to 30, count_bits up to 255).
- `REASONING_MIX`: the mix of `bpe-think-answer-v2` (problem spaces of 20,000 and more questions each).
"""

from __future__ import annotations

from typing import Any

SMALL_MIX: tuple[dict[str, Any], ...] = (
    {"name": "chain_sum", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    {"name": "basic_arithmetic", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                             "operators": ["+", "-", "*"], "allow_parentheses": False,
                                             "allow_negation": False}},
    {"name": "gcd", "options": {"min_value": 1, "max_value": 30}},
    {"name": "count_bits", "options": {"min_n": 1, "max_n": 255}},
)

REASONING_MIX: tuple[dict[str, Any], ...] = (
    {"name": "chain_sum", "options": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}},
    {"name": "basic_arithmetic", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
                                             "operators": ["+", "-", "*"], "allow_parentheses": False,
                                             "allow_negation": False}},
    {"name": "gcd", "options": {"min_value": 1, "max_value": 1000}},
    {"name": "count_bits", "options": {"min_n": 1, "max_n": 65535}},
)
