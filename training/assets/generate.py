"""Regenerates the offline assets shipped with the training package.

    python training/assets/generate.py

- sentiment.jsonl: a 3-class sentiment set (text, label) with a realistic spread of lengths,
  learnable by a tiny model from scratch;
- corpus.txt: short generated stories for causal and masked language modelling;
- tokenizer.json: a byte-level BPE tokenizer trained on both, so nothing is downloaded.

Everything is seeded: running it again gives the same files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SPECIALS = ["<|endoftext|>", "<pad>", "<unk>", "<mask>", "<cls>", "<sep>"]

POSITIVE = ["wonderful", "delightful", "excellent", "brilliant", "charming", "superb", "lovely", "great"]
NEGATIVE = ["terrible", "awful", "dreadful", "boring", "disappointing", "clumsy", "dull", "broken"]
NEUTRAL = ["ordinary", "typical", "average", "standard", "plain", "regular", "usual", "modest"]
THINGS = ["film", "meal", "hotel", "concert", "book", "phone", "service", "trip", "game", "class"]
OPENERS = ["Honestly,", "To be fair,", "Overall,", "In short,", "I think", "My friend said", "Well,", ""]
FILLER = [
    "we arrived late in the evening after a long drive",
    "the staff explained everything twice",
    "it rained for most of the afternoon",
    "my sister had recommended it months ago",
    "the price was about what we expected",
    "there were many people waiting outside",
    "we talked about it all the way home",
    "the second half was quite different from the first",
]
VERBS = {
    "positive": ["loved", "enjoyed", "adored"],
    "negative": ["hated", "regretted", "disliked"],
    "neutral": ["noticed", "tried", "visited"],
}
WORDS = {"positive": POSITIVE, "negative": NEGATIVE, "neutral": NEUTRAL}


def sentiment_example(rng: random.Random) -> dict:
    label = rng.choice(["negative", "neutral", "positive"])
    thing = rng.choice(THINGS)
    parts = [f"{rng.choice(OPENERS)} the {thing} was {rng.choice(WORDS[label])}".strip()]
    # A long tail of lengths: most reviews are short, a few ramble.
    for _ in range(min(int(rng.expovariate(0.7)), 8)):
        parts.append(rng.choice(FILLER))
    if rng.random() < 0.5:
        parts.append(f"we {rng.choice(VERBS[label])} the {rng.choice(WORDS[label])} {thing}")
    tail = parts[1:]
    rng.shuffle(tail)
    text = ", and ".join(parts[:1] + tail) + "."
    # Real reviews are noisy: some labels disagree with the text, so accuracy tops out below 1.
    if rng.random() < 0.08:
        label = rng.choice(["negative", "neutral", "positive"])
    return {"text": text[0].upper() + text[1:], "label": label}


NAMES = ["Ada", "Ben", "Cleo", "Dev", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jon"]
PLACES = ["the market", "the river", "the old library", "the station", "the garden", "the hills"]
OBJECTS = ["a red kite", "a small lamp", "a map", "a loaf of bread", "a wooden box", "a letter"]
ACTIONS = ["walked to", "ran to", "looked for", "waited at", "painted", "cleaned"]
FEELINGS = ["happy", "tired", "curious", "worried", "calm", "excited"]


def story(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    lines = [f"{a} {rng.choice(ACTIONS)} {rng.choice(PLACES)}."]
    for _ in range(rng.randint(3, 7)):
        kind = rng.random()
        if kind < 0.3:
            lines.append(f"There {a} found {rng.choice(OBJECTS)}.")
        elif kind < 0.6:
            lines.append(f"{b} said that the day felt {rng.choice(FEELINGS)}.")
        elif kind < 0.8:
            lines.append(f"Then {a} and {b} {rng.choice(ACTIONS)} {rng.choice(PLACES)} together.")
        else:
            lines.append(f"{a} was {rng.choice(FEELINGS)} because of {rng.choice(OBJECTS)}.")
    lines.append(f"In the end {a} went home {rng.choice(FEELINGS)}.")
    return " ".join(lines)


def main() -> None:
    rng = random.Random(1234)
    with open(HERE / "sentiment.jsonl", "w") as f:
        for _ in range(1500):
            f.write(json.dumps(sentiment_example(rng)) + "\n")
    with open(HERE / "corpus.txt", "w") as f:
        for _ in range(800):
            f.write(story(rng) + "\n")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train([str(HERE / "sentiment.jsonl"), str(HERE / "corpus.txt")], trainer)
    tok.save(str(HERE / "tokenizer.json"))


if __name__ == "__main__":
    main()
