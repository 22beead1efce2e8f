"""Verifiable tasks with exact-answer rewards: multi-digit addition, countdown, and plug-ins.

A task yields `Problem(prompt, answer, numbers, target)` from a deterministic train/test split and
scores a decoded completion: 1.0 when exactly right, else `format_reward` when the completion is
well formed (finished with EOS and parseable), else 0.0. `solution(problem)` is a reference
completion for the SFT warm start.

Plug-ins: `register_task(name, factory)` adds a task by name; `register_reward(name, fn)` adds a
reward `fn(problem, completion, finished) -> float`, usable by any task (`reward=` of `make_task`).
`JsonlTask` reads prompts from a JSONL file (`task="jsonl", dataset=PATH, reward=NAME`).
"""
from __future__ import annotations

import dataclasses
import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Problem:
    id: int          # stable id within the task (used by selective rollouts)
    prompt: str
    answer: str      # reference completion (without EOS)
    numbers: tuple[int, ...] = ()
    target: int = 0
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)  # JSONL extras


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


# ---- plug-ins: rewards and tasks by name ---------------------------------------------------------

RewardFn = Callable[[Problem, str, bool], float]
REWARDS: dict[str, RewardFn] = {}
TASKS: dict[str, Callable[..., Any]] = {}


def register_reward(name: str, fn: RewardFn | None = None, *, overwrite: bool = False):
    """Register `fn(problem, completion, finished) -> float` as reward `name` (usable as a
    decorator: `@register_reward("mine")`)."""
    def add(f):
        if name in REWARDS and not overwrite:
            raise ValueError(f"reward: {name!r} is already registered; pass overwrite=True")
        REWARDS[name] = f
        return f
    return add if fn is None else add(fn)


def register_task(name: str, factory: Callable[..., Any], *, overwrite: bool = False) -> None:
    """Register a task factory; it is called with the keyword arguments of `make_task`."""
    if name in TASKS and not overwrite:
        raise ValueError(f"task: {name!r} is already registered; pass overwrite=True")
    TASKS[name] = factory


@register_reward("exact_match")
def exact_match(problem: Problem, completion: str, finished: bool) -> float:
    """1 when the finished completion equals the reference answer (surrounding spaces ignored)."""
    return float(finished and completion.strip() == problem.answer.strip())


@register_reward("numeric")
def numeric_match(problem: Problem, completion: str, finished: bool) -> float:
    """1 when the finished completion's last number equals the reference answer's last number."""
    nums = [re.findall(r"-?\d+(?:\.\d+)?", t) for t in (completion, problem.answer)]
    return float(finished and bool(nums[0]) and bool(nums[1])
                 and float(nums[0][-1]) == float(nums[1][-1]))


class JsonlTask:
    """Prompts from a JSONL file, one object per line: "prompt" (required), "answer" (reference
    completion: the SFT target and what `exact_match`/`numeric` compare with), optional "split"
    ("train" | "test"; default a deterministic hash split) and any other fields (kept in
    `Problem.info` for custom rewards)."""

    name = "jsonl"

    def __init__(self, path, reward: str = "exact_match", format_reward: float = 0.0,
                 test_fraction: float = 0.1):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"dataset: {str(path)!r} is not a file; give a JSONL file of prompts")
        if reward not in REWARDS:
            raise ValueError(f"reward: {reward!r} is not registered; known: {sorted(REWARDS)}")
        self._reward, self.format_reward = REWARDS[reward], format_reward
        self._pool: dict[str, list[Problem]] = {"train": [], "test": []}
        for n, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt = str(row.pop("prompt"))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise ValueError(f"dataset: line {n + 1} of {path} is not a JSON object with a "
                                 "\"prompt\"") from None
            answer = str(row.pop("answer", ""))
            split = row.pop("split", None) or _split_of(n + 1, test_fraction)
            if split not in self._pool:
                raise ValueError(f"dataset: line {n + 1} of {path} has split {split!r}; use train or test")
            self._pool[split].append(Problem(n, prompt, answer, info=row))
        if not self._pool["train"]:
            raise ValueError(f"dataset: {path} has no training prompts")

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        pool = self._pool[split]
        idx = np.random.default_rng(seed).choice(len(pool), size=min(n, len(pool)), replace=False)
        return [pool[int(i)] for i in idx]

    def max_answer_chars(self) -> int:
        answers = [len(p.answer) for ps in self._pool.values() for p in ps]
        return max(max(answers), 1)

    def solution(self, problem: Problem) -> str:
        return problem.answer

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        return float(self._reward(problem, completion, finished))


class _WithReward:
    """A task whose reward is replaced by a registered one (everything else delegated)."""

    def __init__(self, task, reward: RewardFn):
        self._task, self._fn = task, reward

    def __getattr__(self, name):
        return getattr(self._task, name)

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        return float(self._fn(problem, completion, finished))


register_task("addition", lambda digits=2, format_reward=0.0, **_: AdditionTask(digits, format_reward))
register_task("countdown", lambda countdown_numbers=3, format_reward=0.0, **_:
              CountdownTask(numbers=countdown_numbers, format_reward=format_reward))


def _jsonl(dataset: str = "", reward: str = "", format_reward: float = 0.0, **_):
    if not dataset:
        raise ValueError("dataset: '' is empty; task=jsonl needs dataset=<file.jsonl>")
    return JsonlTask(dataset, reward or "exact_match", format_reward)


register_task("jsonl", _jsonl)


def make_task(name: str, *, digits: int = 2, countdown_numbers: int = 3,
              format_reward: float = 0.0, dataset: str = "", reward: str = ""):
    """Task by registered name ("addition", "countdown", "jsonl", or a plug-in); `reward` names a
    registered reward that replaces the task's own."""
    if name not in TASKS:
        raise ValueError(f"task: {name!r} is unknown; use one of {sorted(TASKS)}")
    if reward and reward not in REWARDS:
        raise ValueError(f"reward: {reward!r} is not registered; known: {sorted(REWARDS)}")
    task = TASKS[name](digits=digits, countdown_numbers=countdown_numbers,
                       format_reward=format_reward, dataset=dataset, reward=reward)
    if reward and name != "jsonl":
        task = _WithReward(task, REWARDS[reward])
    return task
