"""A small openclipart-like SVG tree for the `itune make-clipart` tests: each file states one cleaning case."""

from __future__ import annotations

from pathlib import Path

OPENCLIPART_ROOT = Path("/usr/share/openclipart/svg")

_SVG = """<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<svg xmlns="http://www.w3.org/2000/svg" xmlns:dc="http://purl.org/dc/elements/1.1/"
     xmlns:cc="http://web.resource.org/cc/" xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"
     width="{width}" height="{height}" viewBox="0 0 {width} {height}">
<metadata><rdf:RDF><cc:Work rdf:about="">
<dc:title>{title}</dc:title><dc:description>{description}</dc:description>
<dc:subject><rdf:Bag>{keywords}</rdf:Bag></dc:subject>
<dc:creator><cc:Agent><dc:title>{creator}</dc:title></cc:Agent></dc:creator>
<dc:publisher><cc:Agent><dc:title>Open Clip Art Library</dc:title></cc:Agent></dc:publisher>
</cc:Work></rdf:RDF></metadata>
{body}
</svg>
"""

#: Distinct drawings: a coloured rectangle placed by `index` (no two indices give the same pixels).
COLOURS = ["#c00", "#0a0", "#00c", "#cc0", "#0cc", "#c0c", "#800", "#080", "#008", "#888"]

#: One-word English titles for the plain files (each tagged with itself and its folder's noun).
ANIMALS = ["cat", "dog", "horse", "cow", "sheep", "goat", "pig", "mouse", "rabbit", "fox", "wolf", "bear", "lion",
           "tiger", "zebra", "camel", "otter", "badger", "beaver", "moose", "bison", "panda", "koala", "lemur",
           "mole", "hare", "deer", "llama", "seal", "walrus"]  # fmt: skip


def body(index: int) -> str:
    """A drawing unique to `index`."""
    colour = COLOURS[index % len(COLOURS)]
    x, y = 5 + (index * 7) % 60, 5 + (index * 3) % 40
    return f'<rect x="{x}" y="{y}" width="{20 + index % 17}" height="{15 + index % 11}" fill="{colour}"/>'


def svg(
    title: str = "",
    *,
    description: str = "",
    keywords: tuple[str, ...] = (),
    creator: str = "Jane Doe",
    drawing: str = "",
    width: int = 100,
    height: int = 80,
) -> str:
    """An SVG file's text with openclipart's metadata."""
    items = "".join(f"<rdf:li>{keyword}</rdf:li>" for keyword in keywords)
    return _SVG.format(title=title, description=description, keywords=items, creator=creator, body=drawing,
                       width=width, height=height)  # fmt: skip


#: The file with a broken SVG, and the one declaring an entity (refused, never expanded).
BROKEN = "unsorted/broken.svg"
ENTITY = "unsorted/entity.svg"
BLANK = "special/gradients/gradient-only.svg"
#: The two files that draw the same picture.
IDENTICAL = ("computer/envelope_01.svg", "office/envelope_01.svg")
STARS = 24


#: A drawing of 12 x 8 units on a page of 400 x 300: a speck, cropped to its box.
SMALL = "geography/islands/tiny_island.svg"
#: A series whose files differ by a letter code; two drawings a dot apart under other titles and folders.
LETTER_SERIES = ("tools/holes/bolt_hole_jo_bloggs_ab.svg", "tools/holes/bolt_hole_jo_bloggs_t.svg")
NEAR_IDENTICAL = ("signs/peace_sign.svg", "symbols/calm_mark.svg")
MORE_CASES = {
    SMALL: svg("Tiny island", keywords=("island",), width=400, height=300,
               drawing='<rect x="200" y="150" width="12" height="8" fill="#0a0"/>'),
    LETTER_SERIES[0]: svg("", keywords=("bolt", "hole"), creator="Jo Bloggs", drawing=body(300)),
    LETTER_SERIES[1]: svg("", keywords=("bolt", "hole"), creator="Jo Bloggs", drawing=body(301)),
    NEAR_IDENTICAL[0]: svg("Peace sign", keywords=("peace", "sign"), drawing=body(302)),
    NEAR_IDENTICAL[1]: svg("Calm mark", keywords=("calm", "mark"),
                           drawing=body(302) + '<rect x="90" y="70" width="2" height="2" fill="#000"/>'),
    "animals/dogs/chodovian_dog.svg": svg("Chodovian's dog by Mikola\x9a Ale\x9a", description="HASH(0x8699fd4)",
                                          keywords=("dog",), drawing=body(303)),
    "animals/big_cats/bw_tiger.svg": svg("B_W Tiger", keywords=("tiger",), drawing=body(304)),
    "flags/asia/iraq_flag_1959.svg": svg("Iraqi flag 1959-1963", keywords=("flag", "iraq"), drawing=body(305)),
    "buildings/capitol.svg": svg("US Capitol Building Clipart Style", description="US Capitol Building Clipart Style",
                                 keywords=("building", "capitol"), drawing=body(306)),
}  # fmt: skip


def write_svg_tree(root: Path) -> Path:
    """Write the tree under `root` and return `root`. It holds: boilerplate titles (a collection title, a credit
    prefix naming another file of its series), an author name in a title, a file-name title (camelCase, the author's
    name, a number), a non-English title, a title word no keyword repeats, a numbered series, two files with identical
    pixels, a generated series of `STARS` stars under one title, a broken SVG, one declaring an entity, one that draws
    nothing, and plain files."""
    files = {
        "computer/icons/flat-theme/action/bookmark_folder.svg": svg(
            "Part of the Flat Icon Collection (Wed Aug 25 23:29:46 2004)",
            keywords=("hash", "bookmark", "folder", "computer", "icons", "theme"), creator="Danny Allen",
            drawing=body(101)),
        "shapes/jigsaw/jigsaw_green_03.svg": svg(
            "Clipart by Nicu Buculei - jigsaw_red_10", keywords=("jigsaw", "green"), creator="Nicu Buculei",
            drawing=body(102)),
        "science/astronomy/saturn.svg": svg(
            "Saturn by Dan Gerhards", description="The planet Saturn with its rings. Drawn in 2004.",
            keywords=("planet", "saturn", "space"), creator="Dan Gerhards", drawing=body(103)),
        "food/fruit/redApple_jane_doe_02.svg": svg("", keywords=("apple", "fruit", "red"), drawing=body(104)),
        "animals/birds/cigno_architetto_franc_01.svg": svg(
            "Cigno di notte nella palude", keywords=("architetto francesco rollandin", "bird"),
            creator="Architetto Francesco Rollandin", drawing=body(105)),
        "transportation/boating/capsized_sailing_6.svg": svg(
            "Capsized Sailing Illustration 6", description="Capsized Sailing Illustration 6",
            keywords=("boat", "sailing", "capsized", "illustration"), drawing=body(106)),
        "animals/bison.svg": svg("Bison", keywords=("animal",), creator="Jo Bloggs", drawing=body(109)),
        IDENTICAL[0]: svg("Mail envelope", keywords=("mail", "envelope"), creator="Jo Bloggs", drawing=body(107)),
        IDENTICAL[1]: svg("Envelope", keywords=("envelope", "office"), creator="Jo Bloggs", drawing=body(107)),
        BROKEN: "<svg xmlns='http://www.w3.org/2000/svg'><metadata><title>oops</metadata>",
        ENTITY: '<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY name "boom">]>'
        + svg("&name;", drawing=body(108)).split("?>", 1)[1],
        BLANK: svg("gradient", keywords=("gradient",), drawing="<defs><linearGradient id='g'/></defs>"),
        **MORE_CASES,
    }  # fmt: skip
    for number in range(1, 5):
        files[f"special/patterns/pattern-dots-0{number}.svg"] = svg(
            f"dots {number} pattern", keywords=("dots", "pattern"), creator="Alan Horkan", drawing=body(110 + number)
        )
    for number in range(STARS):
        files[f"shapes/stars/star_{number:02d}pt{number + 3:02d}step.svg"] = svg(
            "gramastar", keywords=("stars", "shapes", "magick"), creator="codifiedivining", drawing=body(200 + number)
        )
    for number, animal in enumerate(ANIMALS):
        files[f"animals/mammals/{animal}.svg"] = svg(
            animal.capitalize(), keywords=(animal, "mammal", "animal"), creator=f"Artist {number % 4}",
            drawing=body(number),
        )  # fmt: skip
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
