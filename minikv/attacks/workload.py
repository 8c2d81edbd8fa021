"""Synthetic multi-tenant traffic for a note-keeping assistant: prompts of notes (`save card ...`) and
documents (`read ...`), and the reply that repeats the note (docs/attacks.md)."""

import random
import string
from dataclasses import dataclass

SECRET_ALPHABET = string.ascii_letters + string.digits + " ,-"
MAX_SECRET_CHARS = 40
SECRET_FIELDS = ("card", "pin", "key", "name", "phone", "iban", "password")
ORDINARY_FIELDS = ("todo", "memo")
TENANTS = (
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
    "mallory", "niaj", "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter", "zoe",
)
# Document words; "save" is deliberately absent so a document never looks like a note.
WORDS = (
    "the a of and to in is for on with as by at from this that report quarterly revenue "
    "growth team meeting plan budget review customer service model cache memory page pool "
    "token request queue prefill decode batch server latency throughput node transfer table "
    "block owner tenant context window length prompt reply error status code engine release "
    "free list slot write read write-up incident timeline summary figure chart draft final "
    "north south east west morning evening monday friday project launch update notes market "
    "price cost risk audit check test result number value total average sales office river "
    "garden music travel weather coffee paper letter story history science policy health"
).split()
ORDINARY_PHRASES = (
    "buy milk and eggs", "call the bank at noon", "book the train to lyon", "water the plants",
    "send the draft to erin", "renew the library card", "fix the bike light", "pay the rent",
    "pick up the parcel", "plan the team lunch", "update the roadmap", "clean the garage",
)


@dataclass(frozen=True)
class Note:
    """One thing a tenant asks the assistant to keep: `save <field> <value>.`"""
    field: str
    value: str

    @property
    def sentence(self) -> str:
        return f"save {self.field} {self.value}."

    @property
    def reply(self) -> str:
        return f"saved {self.field} {self.value}."


def check_secret(secret: str) -> str:
    """Validate a user-supplied secret: 1-40 letters, digits, spaces, '-' or ','."""
    if not 1 <= len(secret) <= MAX_SECRET_CHARS:
        raise ValueError(f"secret must be 1 to {MAX_SECRET_CHARS} characters, got {len(secret)}")
    if bad := sorted(set(secret) - set(SECRET_ALPHABET)):
        raise ValueError(f"secret has characters outside letters, digits, space, '-' and ',': {bad}")
    return secret


def random_secret(rng: random.Random, max_chars: int = MAX_SECRET_CHARS) -> str:
    """A string the model has never seen: random letters, digits, spaces, '-' and ','."""
    return "".join(rng.choice(SECRET_ALPHABET) for _ in range(rng.randint(1, max_chars)))


def realistic_secret(rng: random.Random, field: str) -> str:
    """A value shaped like the field: a card number, a pin, an API key, a name..."""
    digits = lambda n: "".join(rng.choice(string.digits) for _ in range(n))  # noqa: E731
    if field == "card":
        return rng.choice([" ", "-"]).join(digits(4) for _ in range(4))  # the separator drawn first
    if field == "pin":
        return digits(rng.choice([4, 6]))
    if field == "key":
        n = rng.randint(12, 32)
        return "sk-" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))
    if field == "name":
        first = rng.choice(["Ada", "Alan", "Grace", "Linus", "Katherine", "Edsger", "Barbara", "Ken"])
        last = rng.choice(["Lovelace", "Turing", "Hopper", "Torvalds", "Johnson", "Dijkstra", "Liskov"])
        return f"{first} {last}"
    if field == "phone":
        return f"+{digits(2)} {digits(3)} {digits(3)} {digits(4)}"
    if field == "iban":
        return "DE" + digits(2) + " " + " ".join(digits(4) for _ in range(4))
    return random_secret(rng, 24)


def patterned_secret(rng: random.Random) -> str:
    """Runs of repeated characters, like 4111 2222 3333 4444: hard to copy by matching the
    previous character alone, so they are trained on deliberately."""
    groups = []
    while sum(len(g) + 1 for g in groups) < rng.randint(4, 36):
        n = rng.randint(1, 3)
        groups.append("".join(rng.choice(SECRET_ALPHABET[:-3]) * rng.randint(1, 4) for _ in range(n)))
    return rng.choice([" ", "-", ""]).join(groups)[:MAX_SECRET_CHARS]


def random_note(rng: random.Random, secret_share: float = 0.8, patterned_share: float = 0.0) -> Note:
    """A secret-carrying note (mostly) or an ordinary to-do."""
    if rng.random() < secret_share:
        field = rng.choice(SECRET_FIELDS)
        if patterned_share and rng.random() < patterned_share:  # no draw at 0: seeded workloads stay put
            return Note(field, patterned_secret(rng))
        return Note(field, random_secret(rng) if rng.random() < 0.5 else realistic_secret(rng, field))
    return Note(rng.choice(ORDINARY_FIELDS), rng.choice(ORDINARY_PHRASES))


def filler(rng: random.Random, chars: int) -> str:
    """`chars` random letters in words, then a newline (as Gu et al.'s audit prompts): no one else's."""
    words = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8))))
    return " ".join(words)[: chars - 1] + "\n"


def document_sentence(rng: random.Random, num_chars: int) -> str:
    """`read <words>.` about `num_chars` long, made of ordinary words."""
    words = ["read"]
    while sum(len(w) + 1 for w in words) < num_chars:
        words.append(rng.choice(WORDS))
    return " ".join(words) + "."


def make_prompt(tenant: str, sentences: list[str]) -> str:
    """One request's prompt: `tenant: sentence sentence ...\\n`."""
    return f"{tenant}: {' '.join(sentences)}\n"


def note_prompt(tenant: str, note: Note) -> str:
    return make_prompt(tenant, [note.sentence])


def long_document_prompt(tenant: str, num_chars: int, rng: random.Random) -> str:
    """A prompt of exactly `num_chars` characters holding only document text (no note)."""
    head = f"{tenant}: "
    body = document_sentence(rng, num_chars)[: num_chars - len(head) - 2].rstrip() + "."  # cut, then padded
    prompt = head + body.ljust(num_chars - len(head) - 1, ".") + "\n"
    assert len(prompt) == num_chars, (len(prompt), num_chars)
    return prompt


def expected_reply(prompt: str) -> str:
    """What the assistant should answer to `prompt`: the note it holds, repeated."""
    marker = prompt.find("save ")
    if marker < 0:
        return "saved nothing."
    end = prompt.find(".", marker)
    field, _, value = prompt[marker + 5 : end].partition(" ")
    return Note(field, value).reply
