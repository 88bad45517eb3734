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
