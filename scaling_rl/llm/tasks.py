"""Verifiable tasks with exact-answer rewards: multi-digit addition and countdown arithmetic.

A task yields `Problem(prompt, answer, numbers, target)` from a deterministic train/test split and
scores a decoded completion: 1.0 when exactly right, else `format_reward` when the completion is
well formed (finished with EOS and parseable), else 0.0. `solution(problem)` is a reference
completion for the SFT warm start.
"""
from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
import numpy as np


@dataclasses.dataclass(frozen=True)
class Problem:
    id: int          # stable id within the task (used by selective rollouts)
    prompt: str
    answer: str      # reference completion (without EOS)
    numbers: tuple[int, ...] = ()
    target: int = 0


def _split_of(key: int, test_fraction: float) -> str:
    # Knuth multiplicative hash -> deterministic, well mixed held-out set.
    h = (key * 2654435761) % 2**32
    return "test" if h / 2**32 < test_fraction else "train"


class AdditionTask:
    """`a+b=` -> `a+b`. Operands are zero-padded to `digits` digits and the reference answer to
    digits + 1, so every prompt and every reference completion has one length (a tiny model learns
    the aligned format far faster); the reward accepts any digit string equal to the sum."""

    name = "addition"

    def __init__(self, digits: int = 2, format_reward: float = 0.0, test_fraction: float = 0.1):
        if digits < 1 or digits > 6:
            raise ValueError(f"digits: {digits} is outside [1, 6]")
        self.digits, self.format_reward, self.test_fraction = digits, format_reward, test_fraction
        self.base = 10 ** digits
        keys = np.arange(self.base * self.base)
        mask = np.array([_split_of(int(k), test_fraction) == "test" for k in keys])
        self._keys = {"test": keys[mask], "train": keys[~mask]}

    def problem(self, key: int) -> Problem:
        a, b = divmod(int(key), self.base)
        d = self.digits
        return Problem(int(key), f"{a:0{d}d}+{b:0{d}d}=", f"{a + b:0{d + 1}d}", (a, b), a + b)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """n distinct problems of `split` ("train" | "test"), fixed by `seed`."""
        pool = self._keys[split]
        n = min(n, len(pool))
        keys = np.random.default_rng(seed).choice(pool, size=n, replace=False)
        return [self.problem(int(k)) for k in keys]

    def max_answer_chars(self) -> int:
        return self.digits + 1

    def solution(self, problem: Problem) -> str:
        return problem.answer

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        text = completion.strip()
        if not finished or not re.fullmatch(r"\d{1,%d}" % (self.digits + 1), text):
            return 0.0
        return 1.0 if int(text) == problem.target else self.format_reward


# ---- countdown --------------------------------------------------------------------------------

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_TOKEN = re.compile(r"\s*(\d+|[-+*/()])")


def _tokenize(expr: str) -> list[str] | None:
    pos, out = 0, []
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            return None
        out.append(m.group(1))
        pos = m.end()
    return out


def evaluate_expression(expr: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the integer literals of `expr` (+ - * / and parentheses), None if invalid."""
    tokens = _tokenize(expr)
    if not tokens:
        return None
    literals: list[int] = []
    pos = 0

    def atom():
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            v = expr_()
            if pos >= len(tokens) or tokens[pos] != ")":
                raise ValueError
            pos += 1
            return v
        if tok.isdigit():
            literals.append(int(tok))
            return Fraction(int(tok))
        raise ValueError

    def term():
        nonlocal pos
        v = atom()
        while pos < len(tokens) and tokens[pos] in "*/":
            op = tokens[pos]
            pos += 1
            rhs = atom()
            if op == "/" and rhs == 0:
                raise ZeroDivisionError
            v = v * rhs if op == "*" else v / rhs
        return v

    def expr_():
        nonlocal pos
        v = term()
        while pos < len(tokens) and tokens[pos] in "+-":
            op = tokens[pos]
            pos += 1
            rhs = term()
            v = v + rhs if op == "+" else v - rhs
        return v

    try:
        value = expr_()
    except (ValueError, ZeroDivisionError, RecursionError):
        return None
    if pos != len(tokens):
        return None
    return value, literals


class CountdownTask:
    """`3,5,7:22=` -> an expression using each given number exactly once that equals the target."""

    name = "countdown"

    def __init__(self, numbers: int = 3, max_number: int = 20, max_target: int = 99,
                 format_reward: float = 0.0, test_fraction: float = 0.1, pool_size: int = 5000):
        if numbers < 2 or numbers > 5:
            raise ValueError(f"countdown_numbers: {numbers} is outside [2, 5]")
        self.n, self.max_number, self.max_target = numbers, max_number, max_target
        self.format_reward, self.test_fraction = format_reward, test_fraction
        self._pool = {"train": [], "test": []}
        seen = set()
        rng = np.random.default_rng(12345)
        for _ in range(50 * pool_size):  # bounded: small number ranges have few distinct problems
            if len(seen) >= pool_size:
                break
            nums = tuple(int(x) for x in rng.integers(1, max_number + 1, size=numbers))
            expr, value = self._random_expression(nums, rng)
            if value.denominator != 1 or not 1 <= value <= max_target:
                continue
            key = (tuple(sorted(nums)), int(value))
            if key in seen:
                continue
            seen.add(key)
            pid = len(seen) - 1
            split = _split_of(_stable_key(key), test_fraction)
            prompt = ",".join(map(str, nums)) + f":{int(value)}="
            self._pool[split].append(Problem(pid, prompt, expr, nums, int(value)))

    @staticmethod
    def _random_expression(nums, rng) -> tuple[str, Fraction]:
        # Combine the numbers left to right with random operators; parenthesise when needed.
        expr, value, prec = str(nums[0]), Fraction(nums[0]), 3
        for x in nums[1:]:
            op = "+-*"[int(rng.integers(3))]
            if _PREC[op] > prec:
                expr = f"({expr})"
            expr, value = f"{expr}{op}{x}", {"+": value + x, "-": value - x, "*": value * x}[op]
            prec = _PREC[op]
        return expr, value

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        pool = self._pool[split]
        idx = np.random.default_rng(seed).choice(len(pool), size=min(n, len(pool)), replace=False)
        return [pool[int(i)] for i in idx]

    def max_answer_chars(self) -> int:
        return 4 * self.n + 2

    def solution(self, problem: Problem) -> str:
        return problem.answer

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        parsed = evaluate_expression(completion.strip()) if finished else None
        if parsed is None:
            return 0.0
        value, literals = parsed
        if sorted(literals) == sorted(problem.numbers) and value == problem.target:
            return 1.0
        return self.format_reward


def _stable_key(key) -> int:
    nums, target = key
    k = target
    for x in nums:
        k = k * 1009 + x
    return k % 2**31


def make_task(name: str, *, digits: int = 2, countdown_numbers: int = 3,
              format_reward: float = 0.0):
    """Task by name: "addition" | "countdown"."""
    if name == "addition":
        return AdditionTask(digits=digits, format_reward=format_reward)
    if name == "countdown":
        return CountdownTask(numbers=countdown_numbers, format_reward=format_reward)
    raise ValueError(f"task: {name!r} is unknown; use 'addition' or 'countdown'")
