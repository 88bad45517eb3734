"""Hand-written sentences for parity checks, quality tests and benchmarks."""

SENTENCES = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Triton batches requests from many clients into one model execution.",
    "The quarterly report shows revenue growth in every region except Europe.",
    "Ünïcödé, accents and emoji 🚀 are part of real traffic too.",
)

# (a, b): the same meaning in other words.
PARAPHRASES = (
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("A man is riding a horse.", "A man is riding a white horse on an enclosed ground."),
    ("A monkey is playing drums.", "Someone in a gorilla costume is playing a set of drums."),
    ("How do I reset my password?", "I forgot my password, how can I change it?"),
    ("The train to Paris leaves at noon.", "At 12 pm the Paris train departs."),
)

# (a, b): unrelated topics.
UNRELATED = (
    ("A man is eating food.", "A woman is playing violin."),
    ("A monkey is playing drums.", "The quarterly report shows revenue growth."),
    ("How do I reset my password?", "The train to Paris leaves at noon."),
    ("A man is riding a horse.", "Triton batches requests into one model execution."),
    ("The girl is carrying a baby.", "Two men pushed carts through the woods."),
)

LONG_TEXT = " ".join(["Serving models well means batching, caching and measuring."] * 60)

# Mixed-length traffic (``mixed_texts``): English-like sentences composed from these parts.
_SUBJECTS = (
    "The engineer",
    "A small team",
    "Our support desk",
    "The new intern",
    "A delivery driver",
    "The city council",
    "My neighbour",
    "The head chef",
    "A quiet student",
    "The night nurse",
    "An old fisherman",
    "The project lead",
    "A local baker",
    "The tour guide",
    "Her grandmother",
    "The school board",
    "A careful reviewer",
    "The museum curator",
    "Two young pilots",
    "The lab technician",
    "A street musician",
    "The store manager",
    "Our landlord",
)
_VERBS = (
    "repaired",
    "described",
    "carried",
    "painted",
    "tested",
    "ordered",
    "cleaned",
    "measured",
    "opened",
    "photographed",
    "moved",
    "replaced",
    "checked",
    "shared",
    "planned",
    "sold",
    "borrowed",
    "wrapped",
    "counted",
    "explained",
    "delivered",
    "inspected",
    "returned",
)
_OBJECTS = (
    "the broken window",
    "a box of apples",
    "the monthly budget",
    "an old wooden chair",
    "the train schedule",
    "a bright red kite",
    "the kitchen floor",
    "a stack of letters",
    "the garden fence",
    "a map of the coast",
    "the printer on the third floor",
    "a loaf of bread",
    "the hospital records",
    "a pair of boots",
    "the final report",
    "a jar of honey",
    "the bicycle lock",
    "a set of drums",
    "the water pump",
    "a basket of laundry",
)
_PLACES = (
    "near the harbour",
    "in the back office",
    "at the market",
    "behind the station",
    "on the roof",
    "in the village hall",
    "by the river",
    "at the airport",
    "in the basement",
    "outside the library",
    "on the night shift",
    "at the farm",
    "in the workshop",
)
_TIMES = (
    "this morning",
    "before lunch",
    "after the storm",
    "on Friday",
    "late last night",
    "during the meeting",
    "at dawn",
    "last winter",
    "every Sunday",
    "two days ago",
    "before the guests arrived",
    "while it was raining",
)
_LINKS = (
    "because the client asked twice",
    "so that nobody would have to wait",
    "although the weather was poor",
    "and then wrote a short note about it",
    "while everyone else was busy",
    "as the manual suggests",
    "without any help",
    "before anyone noticed the delay",
    "since the old one had failed",
)
MIXED_PASSAGE_SHARE = 0.3  # of mixed_texts(): passages; the rest are single sentences
MIXED_PASSAGE_WORDS = (80, 250)  # a passage's words, inclusive


def _longest(parts) -> int:
    return max(len(p.split()) for p in parts)


# The most words one sentence can have: a passage ends at most that far past its target.
_SENTENCE_WORDS = sum(map(_longest, (_SUBJECTS, _VERBS, _OBJECTS, _PLACES, _TIMES, _LINKS)))


def _sentence(rng) -> str:
    parts = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
    if rng.random() < 0.7:
        parts.append(rng.choice(_PLACES))
    if rng.random() < 0.6:
        parts.append(rng.choice(_TIMES))
    if rng.random() < 0.4:
        parts.append(rng.choice(_LINKS))
    return " ".join(parts) + "."


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct English-like texts: single sentences and passages, in a seeded order.

    ``round(n * MIXED_PASSAGE_SHARE)`` of them are passages of ``MIXED_PASSAGE_WORDS`` words
    (several sentences); the others are one sentence each. The same ``n`` and ``seed`` always
    give the same list.

    Args:
        n: how many texts.
        seed: the random generator's seed.

    Returns:
        The texts, passages at seeded positions among the sentences.
    """
    import random

    rng = random.Random(seed)
    passages = set(rng.sample(range(n), round(n * MIXED_PASSAGE_SHARE)))
    low, high = MIXED_PASSAGE_WORDS
    texts: list[str] = []
    seen: set[str] = set()
    for i in range(n):
        while True:
            if i in passages:
                # Below the top by one sentence's length, so the last sentence still fits.
                target, words = rng.randint(low, high - _SENTENCE_WORDS), 0
                sentences = []
                while words < target:
                    sentences.append(_sentence(rng))
                    words += len(sentences[-1].split())
                text = " ".join(sentences)
            else:
                text = _sentence(rng)
            if text not in seen:
                break
        seen.add(text)
        texts.append(text)
    return texts


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct single sentences in a seeded order: short queries, as retrieval sends them.

    The same ``n`` and ``seed`` always give the same list.
    """
    import random

    rng = random.Random(seed)
    texts: dict[str, None] = {}
    while len(texts) < n:
        texts.setdefault(_sentence(rng))
    return list(texts)
