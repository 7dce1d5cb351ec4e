"""Write the demo's bundled creative-writing SFT data (own work, CC0): `data/creative_sft.jsonl` + `data/heldout.jsonl`.

Every prompt and reference answer is composed here from the word lists and sentence templates below (written for
this project, no external text), with a fixed seed, so the files are reproducible byte for byte::

    python examples/demo/make_data.py            # rewrites examples/demo/data/*.jsonl
    python examples/demo/make_data.py --check    # exit 1 if the committed files differ from what this writes

Four kinds of prompts (short poem, haiku, two-sentence story, three-sentence description), one reference answer
each. The held-out file uses subjects, characters and places that never occur in the training file, so held-out
perplexity measures generalisation to new prompts of the same kinds, not recall.

Lines are `{"id", "kind", "prompt", "completion"}` (prompt: the user message, completion: the reference answer).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 2024
NUM_TRAIN = 320
NUM_HELDOUT = 48

# Subjects: singular noun phrases (poems, haiku). The last block is held out.
SUBJECTS = """
the rain|the sea|an old lighthouse|a winter morning|the city at night|a red fox|the moon|a walled garden
|a train station|an empty beach|a mountain lake|a thunderstorm|a small boat|a quiet library|a paper kite
|the desert wind|a single candle|a slow river|a loaf of bread|an old bicycle|the first snow|a sleeping cat
|the harbor|the morning fog|a flower market|a forest path|the evening star|a kitchen clock|a stone bridge
|a borrowed violin|a field of barley|a lost key|a paper boat|a sunflower|a quiet street|a barn owl
|a folded map|a wooden chair|the last bus home|a pot of tea|a hidden well|the north wind|a bowl of plums
|an open window|a school bell|a fishing village|a rusted gate|the autumn orchard|a willow tree|a lantern
|the tide|a snowy owl|a crowded ferry|a mended coat|a jar of honey|the summer heat|a cold spring|a bell tower
""".replace("\n", "").split("|")
HELDOUT_SUBJECTS = """
a forgotten piano|the river delta|a night bakery|an abandoned greenhouse|the first frost|a heron|a lighthouse keeper's lamp
|a subway platform|a patchwork quilt|the salt marsh|a dusty attic|a copper kettle
""".replace("\n", "").split("|")

CHARACTERS = (
    "Mara|Tomas|Ines|Jun|Aiko|Ravi|Lena|Omar|Nadia|Pablo|Freya|Kofi|Sofia|Elias|Hana|Milo|Zara|Idris".split(
        "|"
    )
)
HELDOUT_CHARACTERS = "Greta|Yusuf|Clara|Tariq|Noor|Anselm".split("|")
ROLES = """
baker|lighthouse keeper|young painter|retired sailor|night nurse|clockmaker|beekeeper|postman|violin teacher
|ferry captain|gardener|bookbinder|shepherd|tailor|astronomer|fisherman|mapmaker|street musician
""".replace("\n", "").split("|")
HELDOUT_ROLES = "glassblower|radio operator|cheesemaker|bell ringer|kite maker|train driver".split("|")
# (present tense for the prompt, past tense for the story)
SITUATIONS = [
    ("finds a letter that was never sent", "found a letter that was never sent"),
    ("hears a song from an empty house", "heard a song coming from an empty house"),
    ("loses the only key to the shop", "lost the only key to the shop"),
    ("meets a stranger who knows their name", "met a stranger who already knew {pos} name"),
    ("wakes up to a town covered in snow", "woke up to find the whole town covered in snow"),
    ("receives a parcel with no address", "received a parcel with no return address"),
    ("discovers a door behind the bookshelf", "discovered a small door behind the bookshelf"),
    ("is asked to keep a secret for a day", "was asked to keep a secret for one day"),
    ("finds a bird with a broken wing", "found a bird with a broken wing on the doorstep"),
    ("misses the last train home", "missed the last train home"),
    ("plants a seed nobody recognises", "planted a seed that nobody in the village recognised"),
    ("repairs a clock that runs backwards", "repaired a clock that ran backwards"),
]
HELDOUT_SITUATIONS = [
    ("finds an old photograph of themselves", "found an old photograph of {obj}self in a market stall"),
    ("hears the sea from the middle of the city", "heard the sea from the middle of the city"),
    (
        "receives a call from a wrong number every night",
        "received a call from the same wrong number every night",
    ),
]
RESOLUTIONS = [
    "By morning {sub} had made up {pos} mind, and {sub} smiled all the way to work.",
    "{Sub} told nobody, but from that day on {sub} left the window open at night.",
    "It took {obj} a whole winter to understand, and by then {sub} was glad it had happened.",
    "{Sub} laughed for the first time in weeks, and the sound surprised the neighbours.",
    "Nothing in the town looked different afterwards, yet {sub} always walked home the long way.",
    "{Sub} wrote everything down in a small notebook, which {sub} still keeps by the bed.",
    "When spring came, {sub} finally understood what it had been trying to say.",
    "{Sub} shared the story with an old friend, and together they decided it was a kind of gift.",
    "Years later, {sub} would say that this was the day everything quietly began.",
    "{Sub} made a pot of tea, sat by the door, and waited to see what would happen next.",
]
PRONOUNS = [
    {"sub": "she", "Sub": "She", "obj": "her", "pos": "her"},
    {"sub": "he", "Sub": "He", "obj": "him", "pos": "his"},
]

PLACES = """
a harbor town|a mountain village|an old market square|a railway station|a lighthouse|a city park|a fishing pier
|a bookshop|a farmhouse kitchen|a forest clearing|a riverside café|a school playground|a hospital corridor
|a desert road|a busy bakery|a snowy valley
""".replace("\n", "").split("|")
HELDOUT_PLACES = "a ferry terminal|a night market|a vineyard|an empty theatre".split("|")
TIMES = """
at dawn|at noon|at dusk|at midnight|in the first hour of morning|on a rainy afternoon|on a winter evening
|at the end of summer
""".replace("\n", "").split("|")

# Poem and haiku building blocks (singular subject; `{S}` = subject with a capital letter).
VERBS = (
    "waits|hums|glows|wanders|sleeps|listens|turns|whispers|shivers|drifts|lingers|sings|rests|dreams".split(
        "|"
    )
)
WHERE = """
beneath the sleeping town|at the edge of the morning|where the road runs out|in the silver hour|under a patient sky
|beside the open door|past the last street light|between the quiet hills|in the hush of evening|by the cold blue water
|above the empty fields|behind the painted shutters
""".replace("\n", "").split("|")
ADVERBS = "slowly|softly|gently|quietly|again|alone|for a while|without a sound".split("|")
IMAGES = """
the wind|a sparrow|an old stone|the grass|a distant bell|a long shadow|the rooftop|a thin smoke|a puddle
|the pale light|a passing cloud|a harbor rope|the clover|the candle flame
""".replace("\n", "").split("|")
PLURAL_VERBS = "lean|answer|gather|tremble|settle|wait|listen|glitter|fade|hum".split("|")
MEMORIES = """
an older summer|a name it never said|the taste of salt|a promise made in passing|the voices of the morning
|a song without words|the colour of the sea|a road it used to know
""".replace("\n", "").split("|")
ADJECTIVES = (
    "quiet|bright|tender|restless|patient|silver|golden|small|faithful|gentle|lonely|weightless".split("|")
)
ENDINGS = """
and the whole world seems to breathe|as if nothing could be lost|and I am almost home|until the light comes back
|and the night forgives us all|like a secret kept for years|and the day begins again|and I let the moment stay
""".replace("\n", "").split("|")
SEASON_WORDS = (
    "spring dusk|summer noon|autumn wind|winter dawn|first thaw|late snow|warm rain|harvest moon".split("|")
)
HAIKU_ENDS = """
one leaf lets go|the kettle sings|a door clicks shut|no one answers|the world goes still|light on the water
|a child laughs|smoke in the cold air
""".replace("\n", "").split("|")

SOUNDS = "gulls|church bells|distant traffic|a radio playing|rain on the roof|children calling|wind in the wires".split(
    "|"
)
SMELLS = "fresh bread|wet stone|coffee|pine needles|salt|woodsmoke|cut grass|oranges".split("|")
LIGHTS = """
falls in long strips across the floor|catches the edges of every window|turns the puddles into mirrors
|softens every colour|lies thin and grey on the rooftops|spills gold across the street
""".replace("\n", "").split("|")
CLOSINGS = """
Nobody seems to be in a hurry.|It feels as if the day is holding its breath.|Everything waits for something to begin.
|For a moment, nothing else matters.|Even the birds seem to speak more softly.|It is the kind of place you remember later.
""".replace("\n", "").split("|")

POEM_PROMPTS = [
    "Write a short poem about {subject}.",
    "Write a four-line poem about {subject}.",
    "Compose a short poem about {subject}.",
    "Write a brief, gentle poem about {subject}.",
]
HAIKU_PROMPTS = ["Write a haiku about {subject}.", "Compose a haiku about {subject}."]
STORY_PROMPTS = [
    "Write a two-sentence story about a {role} who {situation}.",
    "Tell a very short story about a {role} who {situation}.",
]
DESCRIBE_PROMPTS = [
    "Describe {place} {time} in three sentences.",
    "In three sentences, describe {place} {time}.",
]


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def poem(rng: random.Random, subject: str) -> str:
    s = _cap(subject)
    a, b = rng.sample(ADJECTIVES, 2)
    first = rng.choice(
        [
            f"{s} {rng.choice(VERBS)} {rng.choice(WHERE)},",
            f"{s}, {a} and {b},",
            f"I think of {subject} {rng.choice(WHERE)},",
        ]
    )
    image = rng.choice(IMAGES)
    second = rng.choice(
        [
            f"while {image} {rng.choice(VERBS)} {rng.choice(ADVERBS)},",
            f"{_cap(image)} {rng.choice(VERBS)} {rng.choice(WHERE)},",
            f"and {rng.choice(IMAGES)} and {image} {rng.choice(PLURAL_VERBS)} {rng.choice(ADVERBS)},",
        ]
    )
    third = rng.choice(
        [
            f"it keeps {rng.choice(MEMORIES)},",
            f"holding {rng.choice(MEMORIES)} like a {rng.choice(ADJECTIVES)} stone,",
            f"the {rng.choice(ADJECTIVES)} hours {rng.choice(PLURAL_VERBS)} around it,",
            f"and I remember {rng.choice(MEMORIES)},",
        ]
    )
    fourth = f"{rng.choice(ENDINGS)}."
    return "\n".join(_cap(line) for line in (first, second, third, fourth))


def haiku(rng: random.Random, subject: str) -> str:
    return "\n".join(
        [
            f"{_cap(rng.choice(SEASON_WORDS))} —",
            f"{subject} {rng.choice(VERBS)} {rng.choice(ADVERBS)}",
            rng.choice(HAIKU_ENDS),
        ]
    )


def story(rng: random.Random, name: str, role: str, situation_past: str) -> str:
    p = rng.choice(PRONOUNS)
    years = rng.choice(["two", "three", "ten", "twenty", "forty", "many"])
    first = rng.choice(
        [
            f"{name} had been a {role} for {years} years when {p['sub']} {situation_past}.",
            f"One ordinary morning, {name} the {role} {situation_past}.",
            f"On the night before the festival, {name}, the town's only {role}, {situation_past}.",
        ]
    )
    return first.format(**p) + " " + rng.choice(RESOLUTIONS).format(**p)


def description(rng: random.Random, place: str, time: str) -> str:
    a, b = rng.sample(ADJECTIVES, 2)
    first = rng.choice(
        [
            f"{_cap(place)} {time} is {a} and {b}.",
            f"{_cap(time)}, {place} becomes {a} and {b}.",
        ]
    )
    second = rng.choice(
        [
            f"You can hear {rng.choice(SOUNDS)} and smell {rng.choice(SMELLS)}.",
            f"The light {rng.choice(LIGHTS)}, and the air smells of {rng.choice(SMELLS)}.",
            f"Somewhere nearby you can hear {rng.choice(SOUNDS)}, and the light {rng.choice(LIGHTS)}.",
        ]
    )
    return f"{first} {second} {rng.choice(CLOSINGS)}"


def make_examples(rng: random.Random, n: int, heldout: bool) -> list[dict[str, str]]:
    subjects = HELDOUT_SUBJECTS if heldout else SUBJECTS
    characters = HELDOUT_CHARACTERS if heldout else CHARACTERS
    roles = HELDOUT_ROLES if heldout else ROLES
    situations = HELDOUT_SITUATIONS if heldout else SITUATIONS
    places = HELDOUT_PLACES if heldout else PLACES
    # 4 poems, 2 haiku, 2 stories, 2 descriptions in every 10; every kind among the first 4 (the demo samples from
    # the first held-out prompts)
    kinds = ["poem", "story", "haiku", "description", "poem", "story", "poem", "description", "haiku", "poem"]
    out, seen = [], set()
    while len(out) < n:
        kind = kinds[len(out) % len(kinds)]
        if kind in ("poem", "haiku"):
            subject = rng.choice(subjects)
            prompt = rng.choice(POEM_PROMPTS if kind == "poem" else HAIKU_PROMPTS).format(subject=subject)
            completion = poem(rng, subject) if kind == "poem" else haiku(rng, subject)
        elif kind == "story":
            role, (present, past) = rng.choice(roles), rng.choice(situations)
            prompt = rng.choice(STORY_PROMPTS).format(role=role, situation=present)
            completion = story(rng, rng.choice(characters), role, past)
        else:
            place, time = rng.choice(places), rng.choice(TIMES)
            prompt = rng.choice(DESCRIBE_PROMPTS).format(place=place, time=time)
            completion = description(rng, place, time)
        if prompt in seen:  # one reference answer per prompt
            continue
        seen.add(prompt)
        out.append({"kind": kind, "prompt": prompt, "completion": completion})
    return out


def build() -> dict[str, list[dict[str, str]]]:
    rng = random.Random(SEED)
    train = make_examples(rng, NUM_TRAIN, heldout=False)
    heldout = make_examples(rng, NUM_HELDOUT, heldout=True)
    return {
        "creative_sft.jsonl": [{"id": f"train-{i:03d}", **r} for i, r in enumerate(train)],
        "heldout.jsonl": [{"id": f"heldout-{i:03d}", **r} for i, r in enumerate(heldout)],
    }


def render(records: list[dict[str, str]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed files, write nothing"
    )
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    stale = []
    for name, records in build().items():
        path = args.out / name
        text = render(records)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"{path}: {len(records)} examples")
    if stale:
        print("out of date (run python examples/demo/make_data.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
