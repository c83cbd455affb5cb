"""Write a list of task-style user prompts (JSON lines) for `specchat train-draft --prompts`.

Why: the EAGLE-3 head is trained on the target's own answers, and most of its prompts so far were
Magpie prompts (short questions the model writes for itself). On chat benchmarks with longer,
constrained instructions the head's first draft lands far less often (replayed chain of 5 on the
shipped head, session 28: acceptance at the first level 0.59 on held-out Magpie answers, 0.46 on
MT-bench answers, every category lower). These prompts are instructions of that shape: a task, a
subject and one or two constraints, over writing, role-play, reasoning, arithmetic, code,
extraction from a given text, science and the humanities. They are built from our own word lists
by a seeded generator (never from MT-bench, which stays evaluation only).

    .venv/bin/python scripts/task_prompts.py --count 4000 --out assets/train-data/task-prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

SUBJECTS = [
    "a small coffee shop", "a city library", "remote work", "electric bicycles", "a mountain village",
    "the history of the printing press", "urban gardening", "a school science fair", "a new smartphone app",
    "volcanoes", "the water cycle", "a charity bake sale", "public transport", "a local football team",
    "recycling plastic", "a family road trip", "learning to play the piano", "a museum of modern art",
    "honeybees", "solar panels", "a night market", "the first day at a new job", "a lighthouse keeper",
    "space tourism", "a rainy weekend", "an old bookstore", "healthy breakfasts", "a music festival",
    "online privacy", "a community swimming pool", "the invention of the telephone", "desert animals",
    "a startup that sells plant-based snacks", "a robot vacuum cleaner", "winter camping", "a wedding abroad",
    "the Roman aqueducts", "a school uniform policy", "a hiking trail", "ocean tides", "a bakery's new bread",
    "time management for students", "a chess club", "a power outage", "climate change in coastal towns",
    "a second-hand clothing store", "the moon landing", "a neighbourhood clean-up day", "a video game launch",
    "a train journey across Europe", "a fitness tracker", "the Silk Road", "a dentist's office",
    "composting at home", "a job interview", "a historic castle", "self-driving cars", "a food truck",
]
AUDIENCES = ["children aged eight", "busy parents", "university students", "retired teachers", "new employees",
             "tourists", "a city council", "small business owners", "high school students", "software engineers",
             "a general audience", "first-time investors", "nurses", "a book club"]
FORMS = ["a blog post", "a short story", "a poem", "a product description", "a speech", "a persuasive essay",
         "a news article", "a letter to the editor", "a diary entry", "an advertisement", "a limerick",
         "a haiku sequence", "a travel guide entry", "a podcast introduction", "a formal email", "a thank-you note",
         "a movie pitch", "a song chorus", "a press release", "a restaurant review"]
TONES = ["humorous", "formal", "friendly", "dramatic", "optimistic", "neutral", "poetic", "urgent", "nostalgic"]
CONSTRAINTS = [
    "Keep it under 150 words.", "Use exactly three paragraphs.", "End with a question to the reader.",
    "Include a short title.", "Use bullet points for the main ideas.", "Do not use the letter 'z'.",
    "Mention at least two numbers.", "Write it in the second person.", "Start every paragraph with a verb.",
    "Include one quotation from an imaginary expert.", "Finish with a one-sentence summary.",
    "Use simple words only.", "Add a call to action at the end.", "Keep every sentence short.",
]
PERSONAS = ["a pirate captain", "a medieval knight", "a patient chemistry teacher", "a detective in 1920s London",
            "a friendly robot", "a tour guide in Rome", "a sports commentator", "a wise old librarian",
            "a nervous astronaut on her first mission", "a chef who loves spicy food", "a Victorian inventor",
            "a customer support agent", "a park ranger", "a famous painter", "a time traveller from the year 3000"]
CONCEPTS = ["photosynthesis", "inflation", "supply and demand", "black holes", "vaccines", "the greenhouse effect",
            "compound interest", "plate tectonics", "natural selection", "machine learning", "blockchain",
            "the placebo effect", "opportunity cost", "entropy", "the immune system", "gravity", "DNA replication",
            "the stock market", "democracy", "the Renaissance", "the industrial revolution", "quantum computing",
            "antibiotic resistance", "the nitrogen cycle", "electric circuits", "sound waves", "the scientific method",
            "cognitive biases", "the printing press", "the French Revolution", "the Cold War", "impressionism"]
LANGS = ["Python", "JavaScript", "C", "Java", "Go", "Rust", "SQL", "Bash"]
CODE_TASKS = [
    "reverses the words in a sentence", "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number", "counts how often each word appears in a text",
    "merges two sorted lists into one sorted list", "finds the largest and smallest number in a list",
    "removes duplicate items while keeping their order", "converts a temperature from Celsius to Fahrenheit",
    "checks whether a number is prime", "computes the factorial of a number",
    "finds the longest common prefix of a list of strings", "validates an email address in a simple way",
    "rotates a list by k positions", "flattens a nested list", "computes the average of the values in a dictionary",
    "sorts a list of people by age", "reads a CSV file and prints the sum of one column",
    "implements binary search", "groups words by their first letter", "returns the second largest number in a list",
]
NAMES = ["Alice", "Ben", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena", "Marco",
         "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Kyoto", "Lima", "Toronto", "Krakow", "Hanoi", "Dublin", "Tunis", "Perth",
          "Bogota", "Vienna", "Seoul", "Porto"]
ANIMALS = ["cat", "bird", "student", "robot"]
ERAS = ["the Renaissance", "the French Revolution", "the Cold War", "the Silk Road", "the industrial revolution"]
DEBATES = ["school uniforms", "a four-day work week", "banning cars from city centres", "homework",
           "universal basic income"]
ITEMS = ["apples", "notebooks", "tickets", "chairs", "coffee cups", "bicycles", "books", "pencils", "plants"]


def _writing(r: random.Random) -> str:
    return (f"Write {r.choice(FORMS)} about {r.choice(SUBJECTS)} for {r.choice(AUDIENCES)}, in a {r.choice(TONES)} "
            f"tone. {r.choice(CONSTRAINTS)}")


def _rewrite(r: random.Random) -> str:
    s = r.choice(SUBJECTS)
    t1, t2 = r.sample(TONES, 2)
    return (f"Here is a draft sentence: \"Our team has worked on {s} for a long time and we think it is good.\" "
            f"Rewrite it in three different styles: {t1}, {t2} and for {r.choice(AUDIENCES)}.")


def _roleplay(r: random.Random) -> str:
    p = r.choice(PERSONAS)
    asks = [f"What do you think about {r.choice(SUBJECTS)}?", "Describe your typical day.",
            f"Give me your best advice about {r.choice(SUBJECTS)}.", f"Explain {r.choice(CONCEPTS)} to me.",
            "Tell me about the hardest decision you ever made."]
    return f"Pretend to be {p} and stay in character. {r.choice(asks)}"


def _reasoning(r: random.Random) -> str:
    a, b, c = r.sample(NAMES, 3)
    forms = [
        f"{a} is taller than {b}, and {b} is taller than {c}. Who is the shortest? Explain your reasoning "
        "step by step.",
        f"{a} has {r.randint(3, 12)} {r.choice(ITEMS)} and gives half of them to {b}, who then buys {r.randint(2, 9)} "
        f"more. {c} has twice as many as {b} now. How many does {c} have? Think step by step.",
        f"If every {r.choice(ANIMALS)} in a town is {r.choice(['curious', 'fast', 'tired'])}, "
        f"and {a} is one of them, what can we conclude about {a}? What can we not conclude?",
        f"{a}, {b} and {c} sit in a row. {a} is not at either end and {c} is to the left of {a}. "
        f"Where does {b} sit? Explain.",
        f"A train leaves {r.choice(CITIES)} at {r.randint(6, 11)} am and travels at {r.randint(60, 120)} km/h. "
        f"How far has it gone by {r.randint(1, 4)} pm? Show your reasoning.",
    ]
    return r.choice(forms)


def _math(r: random.Random) -> str:
    x, y, z = r.randint(2, 40), r.randint(2, 40), r.randint(2, 9)
    forms = [
        f"Solve for x: {z}x + {x} = {y + z * x}. Show each step.",
        f"What is {x}% of {y * 25}? Explain how you computed it.",
        f"A rectangle is {x} cm long and {y} cm wide. What are its area and perimeter?",
        f"Find the mean, median and range of these numbers: {', '.join(str(r.randint(1, 60)) for _ in range(7))}.",
        f"A shop sells {r.choice(ITEMS)} at {x} dollars each, with a {z * 5}% discount on orders of {y} or more. "
        f"How much do {y + z} of them cost?",
        f"What is the probability of rolling a total of {r.randint(4, 10)} with two fair dice? Explain.",
        f"Simplify the expression ({z}a + {x}b) - ({z - 1}a - {y}b).",
        f"Is {x * y + 1} a prime number? Explain how you checked.",
    ]
    return r.choice(forms)


def _coding(r: random.Random) -> str:
    lang, task = r.choice(LANGS), r.choice(CODE_TASKS)
    forms = [f"Write a {lang} function that {task}. Add a short explanation.",
             f"Write a {lang} function that {task}, and include two example calls with their output.",
             f"How would you write a function in {lang} that {task}? Mention its time complexity.",
             f"Explain the difference between a list and a dictionary in {lang}, with a small example."]
    return r.choice(forms)


def _extraction(r: random.Random) -> str:
    people = r.sample(NAMES, 3)
    cities = r.sample(CITIES, 3)
    text = " ".join(f"{p} moved to {c} in {r.randint(1990, 2023)} and works as a "
                    f"{r.choice(['nurse', 'teacher', 'engineer', 'baker', 'pilot', 'designer'])}."
                    for p, c in zip(people, cities, strict=True))
    asks = ["List each person with their city and year as a table.", "Return the facts as JSON with keys name, city, "
            "year and job.", "Who moved most recently, and where?", "Summarize the text in one sentence."]
    return f"Read the text below and answer.\n\n{text}\n\n{r.choice(asks)}"


def _stem(r: random.Random) -> str:
    c = r.choice(CONCEPTS)
    forms = [f"Explain {c} in simple terms, with an everyday example.",
             f"What are the main causes and effects of {c}? Answer in a short list.",
             f"Describe {c} to {r.choice(AUDIENCES)} in three paragraphs.",
             f"What is a common misconception about {c}, and what is actually true?",
             f"Compare {c} and {r.choice(CONCEPTS)}: how are they alike and how do they differ?"]
    return r.choice(forms)


def _humanities(r: random.Random) -> str:
    forms = [f"Discuss the advantages and disadvantages of {r.choice(SUBJECTS)} for {r.choice(AUDIENCES)}.",
             f"What lessons can we learn from {r.choice(ERAS)} today? Give three examples.",
             f"Write a short argument for and against {r.choice(DEBATES)}.",
             f"How might {r.choice(SUBJECTS)} change in the next twenty years? Explain your view."]
    return r.choice(forms)


KINDS: list[Callable[[random.Random], str]] = [_writing, _rewrite, _roleplay, _reasoning, _math, _coding, _extraction,
                                               _stem, _humanities]


def prompts(count: int, seed: int) -> list[str]:
    """``count`` distinct prompts, the kinds in turn, from a seeded generator (same seed, same list)."""
    r = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    tries = 0
    while len(out) < count and tries < count * 50:
        text = KINDS[tries % len(KINDS)](r)
        tries += 1
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    texts = prompts(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"t{i:05d}", "messages": [{"role": "user", "content": t}]}) + "\n")
    print(f"{len(texts)} prompts -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
