#!/usr/bin/env python3
"""Writes a deterministic mix of generic user prompts (explanations, advice, writing,
comparisons, Python coding tasks) as OpenAI-style jsonl, one {"messages": [{"role":
"user", "content": ...}]} per line, for `draftline regen` to answer with the target.

Why: the shared data holds only GSM8K questions and a small ShareGPT sample of
near-identical identity chats; a drafter trained on those learns the target's math
style only. These templates broaden the regenerated responses towards general chat
and code without touching the held-out eval sets (MT-Bench, HumanEval): none of
their prompts is used or paraphrased here; topics and tasks are generic.

usage: python3 scripts/synth_prompts.py OUT.jsonl [N]   (N: at most N prompts, in a
fixed shuffled order; default all)"""
import json
import random
import sys

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "inflation in economics", "the French Revolution",
    "machine learning", "climate change", "the immune system", "volcanoes", "the stock market",
    "renewable energy", "the Roman Empire", "DNA replication", "plate tectonics", "supply and demand",
    "the internet", "vaccines", "gravity", "the printing press", "coral reefs", "electric cars",
    "meditation", "sleep", "healthy eating", "time management", "public speaking", "learning a new language",
    "saving money", "starting a small business", "remote work", "social media", "recycling",
    "the solar system", "earthquakes", "democracy", "the industrial revolution", "antibiotics",
    "quantum computing", "cryptography", "the human brain", "honey bees", "rainforests", "the moon landing",
    "the Renaissance", "jazz music", "chess", "gardening", "cooking pasta", "running a marathon",
    "job interviews", "writing a resume", "urban planning", "artificial intelligence ethics",
    "ocean tides", "the periodic table", "nuclear energy", "the history of writing", "video games",
]

TEMPLATES = [
    "Explain {t} in simple terms.",
    "What are the main facts everyone should know about {t}?",
    "Write a short paragraph introducing {t} to a high school student.",
    "What are the pros and cons of {t}?",
    "Give me five tips related to {t}.",
    "Write a short blog post about {t}.",
    "Summarize the history of {t} in a few sentences.",
    "What are common misconceptions about {t}?",
    "Write a short poem about {t}.",
    "How would you explain {t} to a ten-year-old?",
    "Write a persuasive paragraph on why people should care about {t}.",
    "List three questions a student might ask about {t}, and answer them.",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "merges two sorted lists into one sorted list",
    "removes duplicates from a list while keeping the order", "computes the factorial of n",
    "checks whether a string is a palindrome", "finds the largest element of a list",
    "returns the sum of the digits of an integer", "converts Celsius to Fahrenheit",
    "flattens a nested list", "counts how often each word occurs in a text",
    "returns the greatest common divisor of two integers", "sorts a list of tuples by their second item",
    "checks whether two strings are anagrams", "returns the transpose of a matrix given as a list of lists",
    "computes the average of a list of numbers, returning 0 for an empty list",
    "finds the index of an item in a sorted list with binary search",
    "returns all even numbers from a list", "capitalizes the first letter of every word",
    "computes the running sum of a list", "returns the second largest distinct number in a list",
    "checks whether parentheses in a string are balanced", "converts a binary string to an integer",
    "rotates a list by k positions", "returns the longest word in a sentence",
    "counts the number of uppercase letters in a string", "computes the dot product of two vectors",
    "returns the common elements of two lists", "splits a list into chunks of size k",
    "checks whether a year is a leap year", "returns the mode of a list of numbers",
    "computes the power set of a small list", "replaces every vowel in a string with '*'",
    "returns the number of days between two dates given as strings",
]

CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}. Include a docstring and an example.",
    "Implement a function in Python that {t}, and explain how it works.",
]


def prompts():
    out = [tp.format(t=t) for t in TOPICS for tp in TEMPLATES]
    out += [tp.format(t=t) for t in CODE_TASKS for tp in CODE_TEMPLATES]
    random.Random(0).shuffle(out)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ps = prompts()
    if len(sys.argv) > 2:
        ps = ps[: int(sys.argv[2])]
    with open(sys.argv[1], "w") as f:
        for p in ps:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
    print(f"{sys.argv[1]}: {len(ps)} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
