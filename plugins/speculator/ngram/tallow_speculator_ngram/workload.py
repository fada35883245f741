"""A code-editing workload: 20 chat requests, each giving a function and asking for a change.

Answers to such requests copy most of the function they were given, which is what prompt
lookup predicts. The tests and the acceptance benchmark (``bench/spec_acceptance.py``) use
these to measure the ``ngram`` speculator on real text.
"""

from __future__ import annotations

FUNCTIONS: list[tuple[str, str]] = [
    (
        "def average(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(values)\n",
        "Make it return 0.0 for an empty list.",
    ),
    (
        "def find_user(users, name):\n    for user in users:\n        if user['name'] == name:\n"
        "            return user\n    return None\n",
        "Make the name comparison case-insensitive.",
    ),
    (
        "def read_lines(path):\n    with open(path) as f:\n        lines = f.readlines()\n"
        "    return [line.strip() for line in lines]\n",
        "Skip empty lines in the result.",
    ),
    (
        "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n"
        "            out.append('FizzBuzz')\n        elif i % 3 == 0:\n            out.append('Fizz')\n"
        "        elif i % 5 == 0:\n            out.append('Buzz')\n        else:\n"
        "            out.append(str(i))\n    return out\n",
        "Rename the function to fizz_buzz and add a docstring.",
    ),
    (
        "def merge_dicts(a, b):\n    result = dict(a)\n    for key, value in b.items():\n"
        "        result[key] = value\n    return result\n",
        "Add type hints for dict[str, int] arguments and result.",
    ),
    (
        "def count_words(text):\n    counts = {}\n    for word in text.split():\n"
        "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
        "Lower-case every word before counting it.",
    ),
    (
        "def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, n):\n"
        "        if n % d == 0:\n            return False\n    return True\n",
        "Only test divisors up to the square root of n.",
    ),
    (
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n"
        "        return hi\n    return x\n",
        "Raise ValueError when lo is greater than hi.",
    ),
    (
        "def flatten(items):\n    out = []\n    for item in items:\n        if isinstance(item, list):\n"
        "            out.extend(flatten(item))\n        else:\n            out.append(item)\n"
        "    return out\n",
        "Also flatten tuples.",
    ),
    (
        "def parse_config(text):\n    config = {}\n    for line in text.splitlines():\n"
        "        key, value = line.split('=')\n        config[key] = value\n    return config\n",
        "Ignore lines starting with '#'.",
    ),
    (
        "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n"
        "        self.count += 1\n        return self.count\n",
        "Add a reset method that sets the count back to zero.",
    ),
    (
        "def chunk(items, size):\n    chunks = []\n    for i in range(0, len(items), size):\n"
        "        chunks.append(items[i:i + size])\n    return chunks\n",
        "Raise ValueError when size is not positive.",
    ),
    (
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32\n\n\n"
        "def fahrenheit_to_celsius(f):\n    return (f - 32) * 5 / 9\n",
        "Round both results to two decimals.",
    ),
    (
        "def unique(items):\n    seen = []\n    for item in items:\n        if item not in seen:\n"
        "            seen.append(item)\n    return seen\n",
        "Use a set to remember the items already seen, keeping the order.",
    ),
    (
        "def get_extension(filename):\n    parts = filename.split('.')\n    return parts[-1]\n",
        "Return an empty string when the filename has no dot.",
    ),
    (
        "def sum_squares(numbers):\n    result = 0\n    for n in numbers:\n        result += n * n\n"
        "    return result\n",
        "Rewrite it with a generator expression.",
    ),
    (
        "def retry(func, attempts):\n    for i in range(attempts):\n        try:\n"
        "            return func()\n        except Exception:\n            pass\n"
        "    raise RuntimeError('all attempts failed')\n",
        "Sleep one second between attempts.",
    ),
    (
        "def to_snake_case(name):\n    out = ''\n    for ch in name:\n        if ch.isupper():\n"
        "            out += '_' + ch.lower()\n        else:\n            out += ch\n    return out\n",
        "Do not add an underscore before the first character.",
    ),
    (
        "def max_index(values):\n    best = 0\n    for i in range(len(values)):\n"
        "        if values[i] > values[best]:\n            best = i\n    return best\n",
        "Return None for an empty list.",
    ),
    (
        "def greet(name):\n    message = 'Hello, ' + name + '!'\n    print(message)\n"
        "    return message\n",
        "Use an f-string and remove the print.",
    ),
]

SYSTEM = "You are a coding assistant. Answer with the complete changed code only."


def code_edit_conversations() -> list[list[dict[str, str]]]:
    """The 20 requests as chat messages."""
    return [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"```python\n{code}```\n{task}"},
        ]
        for code, task in FUNCTIONS
    ]
