"""The project's small OCRBench-style set: text rendered by Pillow, in the official repo's layout.

Writes <cache>/ocrbench-generated-v<GENERATOR_VERSION>/OCRBench.json (keys dataset_name, id,
image_path, question, answers, type) and OCRBench_Images/<source>/<n>.png, where <cache> is
$OSCAR_EVAL_CACHE or ~/.cache/oscar-eval. All ten categories get ITEMS_PER_CATEGORY items, drawn
with several fonts (matplotlib's bundled DejaVu / Computer Modern / STIX files and Pillow's own
font), sizes, rotations, colours and Gaussian noise. Everything comes from one seed, so the same
bytes come out every time on one Pillow/numpy/matplotlib install; the folder is rebuilt when missing.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tasks.common import COMPLETE_MARKER, ensure_built

GENERATOR_VERSION = 1  # bump when the generated content changes
SEED = 20240611
ITEMS_PER_CATEGORY = 3

WORDS = (
    "centre friend chain close market extra cottage ahead times group under palace high grocery gallery "
    "united western college avenue fitting national canary students copies music systems orange borough "
    "joint thank coffee sale next closing threads world rent parliament fitness garden station harbour "
    "window bakery river summer quiet silver number letter"
).split()
NAMES = "bluebird sunrise maple lighthouse copper juniper harvest meadow".split()
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "cmr10.ttf", "STIXGeneral.ttf")
ITALIC_FONT_FILES = ("DejaVuSans-Oblique.ttf", "DejaVuSerif-Italic.ttf", "cmti10.ttf")
BOLD_FONT_FILES = ("DejaVuSans-Bold.ttf", "DejaVuSerif-Bold.ttf", "STIXGeneralBol.ttf")


def _font(rng: random.Random, files: tuple[str, ...], size: int, builtin_ok: bool = True):
    """A TrueType font from matplotlib's bundled files; Pillow's built-in font for one draw in four
    where `builtin_ok` (it lacks glyphs such as the superscript two)."""
    from PIL import ImageFont

    if rng.random() < 0.25 and builtin_ok:
        return ImageFont.load_default(size=size)
    import matplotlib

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / rng.choice(files)), size)


def render(
    lines: list[str],
    font,
    fg=(0, 0, 0),
    bg=(255, 255, 255),
    rotation: float = 0.0,
    noise: float = 0.0,
    stroke: int = 0,
    jitter: int = 0,
    seed: int = 0,
) -> bytes:
    """Draw `lines` (top to bottom) and return PNG bytes.

    rotation: degrees, counter-clockwise, canvas expanded; noise: std of additive Gaussian pixel
    noise (0-255 scale); stroke: outline width in the inverse colour; jitter: max vertical pixel
    offset per character (a crude hand-written wobble).
    """
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    pad, gap = 12, 6
    boxes = [font.getbbox(line, stroke_width=stroke) for line in lines]
    width = max(b[2] - b[0] for b in boxes) + 2 * pad + 2 * jitter
    height = sum(b[3] - b[1] for b in boxes) + gap * (len(lines) - 1) + 2 * pad + 2 * jitter
    image = Image.new("RGB", (int(width), int(height)), bg)
    draw = ImageDraw.Draw(image)
    y = pad + jitter
    for line, box in zip(lines, boxes):
        x = pad
        for ch in line if jitter else [line]:
            dy = int(rng.integers(-jitter, jitter + 1)) if jitter else 0
            draw.text(
                (x - box[0], y - box[1] + dy),
                ch,
                font=font,
                fill=fg,
                stroke_width=stroke,
                stroke_fill=tuple(255 - c for c in fg),
            )
            x += font.getlength(ch)
        y += box[3] - box[1] + gap
    if rotation:
        image = image.rotate(rotation, expand=True, fillcolor=bg, resample=Image.Resampling.BICUBIC)
    if noise:
        pixels = np.asarray(image, dtype=np.float32) + rng.normal(0.0, noise, (image.height, image.width, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


# Each maker: (rng, index) -> (source dataset, question, answers, lines, render options).
Maker = Callable[[random.Random, int], tuple[str, str, list[str], list[str], dict[str, Any]]]
READ = "what is written in the image?"


def _regular(rng, i):
    word = rng.choice(WORDS)
    word = word.upper() if i % 2 else word
    return (
        ("IIIT5K", "svt", "IC13_857")[i % 3],
        READ,
        [word],
        [word],
        {"font": _font(rng, FONT_FILES, rng.choice((28, 34, 40)))},
    )


def _irregular(rng, i):
    word = rng.choice(WORDS).upper()
    angle = rng.choice((-1, 1)) * rng.uniform(12, 30)
    return (
        ("IC15_1811", "svtp", "ct80")[i % 3],
        READ,
        [word],
        [word],
        {"font": _font(rng, FONT_FILES, 32), "rotation": angle, "noise": 14.0},
    )


def _artistic(rng, i):
    word = rng.choice(WORDS)
    fg = (rng.randrange(120, 256), rng.randrange(0, 90), rng.randrange(40, 200))
    bg = (rng.randrange(0, 60), rng.randrange(30, 90), rng.randrange(60, 120))
    return (
        "WordArt",
        READ,
        [word],
        [word.upper()],
        {"font": _font(rng, BOLD_FONT_FILES, 44), "fg": fg, "bg": bg, "stroke": 2, "rotation": rng.uniform(-6, 6)},
    )


def _handwriting(rng, i):
    word = rng.choice(WORDS)
    return ("IAM", READ, [word], [word], {"font": _font(rng, ITALIC_FONT_FILES, 36), "jitter": 3, "noise": 6.0})


def _digits(rng, i):
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(4, 8)))
    return (
        "ORAND",
        "what is the number in the image?",
        [digits],
        [digits],
        {"font": _font(rng, ITALIC_FONT_FILES + FONT_FILES, 34), "noise": 8.0, "jitter": 2},
    )


def _non_semantic(rng, i):
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 8)))
    return ("NonSemanticText", READ, [text], [text], {"font": _font(rng, FONT_FILES, 32)})


def _scene_vqa(rng, i):
    name = rng.choice(NAMES)
    kind = rng.choice(("cafe", "bakery", "books"))
    return (
        ("STVQA", "textVQA", "ocrVQA")[i % 3],
        f"what is the name of the {kind}?",
        [name, f"{name} {kind}"],
        ["OPEN DAILY", f"{name.upper()} {kind.upper()}"],
        {
            "font": _font(rng, BOLD_FONT_FILES, 30),
            "fg": (250, 250, 240),
            "bg": (20, 70, 40),
            "rotation": rng.uniform(-4, 4),
            "noise": 10.0,
        },
    )


def _doc_vqa(rng, i):
    number = str(rng.randint(10000, 99999))
    date = f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/20{rng.randint(10, 24)}"
    lines = ["INVOICE", f"Invoice No: {number}", f"Date: {date}", f"Bill to: {rng.choice(NAMES).title()} Ltd."]
    return (
        ("docVQA", "infographicVQA", "ChartQA")[i % 3],
        "What is the invoice number?",
        [number],
        lines,
        {"font": _font(rng, FONT_FILES, 20)},
    )


def _kie(rng, i):
    items = [(rng.choice(WORDS).upper(), rng.randint(100, 2000) / 100) for _ in range(3)]
    total = f"{sum(p for _, p in items):.2f}"
    lines = [f"{rng.choice(NAMES).upper()} STORE"] + [f"{w:<10} {p:>7.2f}" for w, p in items] + [f"TOTAL {total:>12}"]
    return (
        ("SROIE", "FUNSD", "POIE")[i % 3],
        "what is the total amount of this receipt? Answer this question using the text in the image directly.",
        [total],
        lines,
        {"font": _font(rng, ("DejaVuSansMono.ttf",), 18), "noise": 5.0},
    )


def _hme(rng, i):
    a, b, c = rng.randint(2, 9), rng.randint(1, 9), rng.randint(10, 99)
    shown = f"{a}x² + {b} = {c}"
    latex = f"{a} x ^ {{ 2 }} + {b} = {c}"
    return (
        "HME100k",
        "Please write out the expression of the formula in the image using LaTeX format.",
        [latex],
        [shown],
        {"font": _font(rng, ("DejaVuSerif-Italic.ttf", "DejaVuSans.ttf"), 36, builtin_ok=False), "jitter": 2},
    )


MAKERS: dict[str, Maker] = {
    "Regular Text Recognition": _regular,
    "Irregular Text Recognition": _irregular,
    "Artistic Text Recognition": _artistic,
    "Handwriting Recognition": _handwriting,
    "Digit String Recognition": _digits,
    "Non-Semantic Text Recognition": _non_semantic,
    "Scene Text-centric VQA": _scene_vqa,
    "Doc-oriented VQA": _doc_vqa,
    "Key Information Extraction": _kie,
    "Handwritten Mathematical Expression Recognition": _hme,
}


def build(target: Path, seed: int = SEED, per_category: int = ITEMS_PER_CATEGORY) -> list[dict[str, Any]]:
    """Write the set into `target` (official layout) and return the json records."""
    rng = random.Random(seed)
    records = []
    for category, maker in MAKERS.items():
        for i in range(per_category):
            source, question, answers, lines, options = maker(rng, i)
            rel = f"{source}/{len(records):04d}.png"
            (target / "OCRBench_Images" / source).mkdir(parents=True, exist_ok=True)
            png = render(lines, seed=rng.randrange(2**31), **options)
            (target / "OCRBench_Images" / rel).write_bytes(png)
            answer_field: str | list[str] = answers[0] if len(answers) == 1 else answers  # both forms occur officially
            records.append(
                {
                    "dataset_name": source,
                    "id": len(records),
                    "image_path": rel,
                    "question": question,
                    "answers": answer_field,
                    "type": category,
                }
            )
    (target / "OCRBench.json").write_text(json.dumps(records, indent=1, ensure_ascii=False), encoding="utf-8")
    (target / COMPLETE_MARKER).write_text(str(GENERATOR_VERSION))
    return records


def ensure_generated(root: Path | None = None) -> Path:
    """The generated set's folder, built first when missing (see tasks.common.ensure_built)."""
    return ensure_built(f"ocrbench-generated-v{GENERATOR_VERSION}", build, root)


# Canvas sizes (width, height) in the range of the real benchmark's images, whose sources are photographs and
# document scans far larger than the word crops above: a TextVQA-style photo (1024 x 768), a FUNSD form scan
# (762 x 1000), a SROIE-style receipt (1000 x 1800) and a DocVQA-style page (1700 x 2200). Image tokens grow with
# the pixels (Qwen3-VL: one per 32 x 32 block; LLaVA-NeXT anyres: up to 5 tiles of 576), so these items carry the
# real benchmark's prompt lengths: what memory and speed depend on.
PAGE_SIZES = ((1024, 768), (762, 1000), (1000, 1800), (1700, 2200))
PAGE_CATEGORIES = (
    "Scene Text-centric VQA",
    "Doc-oriented VQA",
    "Key Information Extraction",
    "Regular Text Recognition",
)


def render_on_page(lines: list[str], font, size: tuple[int, int], seed: int, **options) -> bytes:
    """`lines` rendered as in `render`, pasted at a random spot of a `size` page of paper-coloured noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    page = np.clip(rng.normal(236.0, 9.0, (h, w, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(page)
    text = Image.open(io.BytesIO(render(lines, font, seed=seed, **options))).convert("RGB")
    text.thumbnail((w - 8, h - 8))
    image.paste(text, (int(rng.integers(0, w - text.width + 1)), int(rng.integers(0, h - text.height + 1))))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def build_large(target: Path, seed: int = SEED) -> list[dict[str, Any]]:
    """One item of each of PAGE_CATEGORIES on each of PAGE_SIZES (16, first: `--limit 16` takes exactly them), then
    the generated set, in the official layout: for measuring speed and memory at the real benchmark's prompt
    lengths."""
    rng = random.Random(seed + 1)
    pages = []
    for size in PAGE_SIZES:
        for category in PAGE_CATEGORIES:
            source, question, answers, lines, options = MAKERS[category](rng, len(pages))
            font = options.pop("font")
            rel = f"{source}/page{len(pages):02d}-{size[0]}x{size[1]}.png"
            (target / "OCRBench_Images" / source).mkdir(parents=True, exist_ok=True)
            png = render_on_page(lines, font, size, seed=rng.randrange(2**31), **options)
            (target / "OCRBench_Images" / rel).write_bytes(png)
            pages.append(
                {
                    "dataset_name": source,
                    "image_path": rel,
                    "question": question,
                    "answers": answers[0] if len(answers) == 1 else answers,
                    "type": category,
                }
            )
    records = pages + build(target, seed)
    for i, record in enumerate(records):
        record["id"] = i
    (target / "OCRBench.json").write_text(json.dumps(records, indent=1, ensure_ascii=False), encoding="utf-8")
    return records


def ensure_generated_large(root: Path | None = None) -> Path:
    """The generated set with its page-sized items (`build_large`), built first when missing."""
    return ensure_built(f"ocrbench-generated-large-v{GENERATOR_VERSION}", build_large, root)
