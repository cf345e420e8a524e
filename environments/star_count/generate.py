"""Deterministic generator for the star-count task: canvases with coloured five-pointed stars.

Everything random comes from one ``random.Random(seed)`` per example, so an example is a pure
function of ``(seed, config)`` and identical on every run and machine. Training examples use
seeds ``0, 1, 2, ...`` (below ``VALIDATION_SEED_OFFSET``), validation examples
``VALIDATION_SEED_OFFSET + i``, and the fixed held-out split ``HELDOUT_SEED_OFFSET + i`` for
``i < HELDOUT_SIZE``, so no two splits ever share a seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Pillow is imported by render(): a run on a warm cache draws nothing
    from PIL import Image

RGB = tuple[int, int, int]

VALIDATION_SEED_OFFSET = 500_000
HELDOUT_SEED_OFFSET = 1_000_000
HELDOUT_SIZE = 64

#: Fixed palette. Pure, well separated hues on a dark background.
DEFAULT_COLOURS: dict[str, RGB] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 235),
}


@dataclass(frozen=True)
class StarCountConfig:
    """Everything that defines the task distribution. Frozen: a config is a value. A dataclass,
    not a pydantic model: every experiment and evaluation imports this module, and pydantic was
    a tenth of their start-up."""

    #: Square canvas sides in pixels; each example picks one uniformly.
    resolutions: tuple[int, ...] = (64, 96, 128)
    #: Colour name -> RGB. The order is the canonical order of answers.
    colours: dict[str, RGB] = field(default_factory=lambda: dict(DEFAULT_COLOURS))
    #: Inclusive range of the number of stars of each colour.
    count_range: tuple[int, int] = (0, 3)
    #: Inclusive range of a star's outer radius, as a fraction of the canvas side.
    radius_range: tuple[float, float] = (0.085, 0.095)
    #: Inner (valley) radius as a fraction of the outer radius.
    inner_ratio: float = 0.45
    #: 0 = stars never overlap (their circumscribed circles are disjoint). A value v in (0, 1)
    #: lets two circumscribed circles intersect as long as the centre distance is at least
    #: (1 - v) * (r1 + r2).
    max_overlap: float = 0.0
    #: Canvas background colour.
    background: RGB = (20, 20, 28)
    #: Supersampling factor used when rendering (anti-aliased edges); 1 disables it.
    supersample: int = 2
    #: Placement attempts per star before the whole layout is restarted.
    max_attempts: int = 200

    def __post_init__(self) -> None:
        lo, hi = self.count_range
        if not 0 <= lo <= hi:
            raise ValueError(f"bad count_range {self.count_range}")
        rlo, rhi = self.radius_range
        if not 0 < rlo <= rhi < 0.5:
            raise ValueError(f"bad radius_range {self.radius_range}")
        if not 0 <= self.max_overlap < 1:
            raise ValueError("max_overlap must be in [0, 1)")
        if not self.resolutions or min(self.resolutions) < 8:
            raise ValueError("resolutions must be non-empty and >= 8")
        if not self.colours:
            raise ValueError("need at least one colour")
        if self.supersample < 1:
            raise ValueError("supersample must be >= 1")

    @property
    def colour_names(self) -> list[str]:
        return list(self.colours)

    def fingerprint(self) -> str:
        """Short stable hash of the config (used for cache keys)."""
        # The JSON pydantic wrote when this was a model: the caches' keys stay as they were.
        compact = json.dumps(asdict(self), separators=(",", ":"))
        return hashlib.sha256(compact.encode()).hexdigest()[:16]


DEFAULT_CONFIG = StarCountConfig()
DEFAULT = DEFAULT_CONFIG


@dataclass(frozen=True)
class Star:
    x: float
    y: float
    radius: float  # outer radius in pixels
    rotation: float  # radians
    colour: str
    rgb: RGB

    def to_dict(self) -> dict[str, Any]:
        return {
            "x": round(self.x, 3),
            "y": round(self.y, 3),
            "radius": round(self.radius, 3),
            "rotation": round(self.rotation, 5),
            "colour": self.colour,
        }


@dataclass(frozen=True)
class Example:
    seed: int
    width: int
    height: int
    stars: tuple[Star, ...]
    counts: dict[str, int]
    background: RGB = (20, 20, 28)
    inner_ratio: float = 0.45
    supersample: int = 1


def _place(
    rng: random.Random, size: int, radius: float, placed: list[Star], cfg: StarCountConfig
) -> tuple[float, float] | None:
    factor = 1.0 - cfg.max_overlap
    for _ in range(cfg.max_attempts):
        x = rng.uniform(radius, size - radius)
        y = rng.uniform(radius, size - radius)
        if all(math.hypot(x - s.x, y - s.y) >= factor * (radius + s.radius) for s in placed):
            return x, y
    return None


def make_example(seed: int, cfg: StarCountConfig = DEFAULT_CONFIG) -> Example:
    """Build the example for ``seed``: a pure function of ``(seed, cfg)``."""
    rng = random.Random(seed)
    size = rng.choice(cfg.resolutions)
    lo, hi = cfg.count_range
    counts = {name: rng.randint(lo, hi) for name in cfg.colours}
    to_draw = [name for name, n in counts.items() for _ in range(n)]
    rng.shuffle(to_draw)
    # Radii and rotations are drawn once; only positions are re-drawn on a restart.
    radii = [rng.uniform(*cfg.radius_range) * size for _ in to_draw]
    rotations = [rng.uniform(0.0, 2 * math.pi / 5) for _ in to_draw]
    # Place big stars first: rejection sampling succeeds far more often.
    order = sorted(range(len(to_draw)), key=lambda i: -radii[i])
    for _restart in range(100):
        placed: list[Star] = []
        for i in order:
            pos = _place(rng, size, radii[i], placed, cfg)
            if pos is None:
                break
            name = to_draw[i]
            placed.append(Star(pos[0], pos[1], radii[i], rotations[i], name, cfg.colours[name]))
        else:
            # Draw order = the shuffled order, not the size order.
            by_index = dict(zip(order, placed, strict=True))
            stars = tuple(by_index[i] for i in range(len(to_draw)))
            return Example(
                seed=seed,
                width=size,
                height=size,
                stars=stars,
                counts=counts,
                background=cfg.background,
                inner_ratio=cfg.inner_ratio,
                supersample=cfg.supersample,
            )
    raise RuntimeError(f"could not place {len(to_draw)} stars for seed {seed}; the config is too dense")


def star_polygon(star: Star, inner_ratio: float = 0.45, scale: float = 1.0) -> list[tuple[float, float]]:
    """The ten vertices of a five-pointed star (first point straight up before rotation)."""
    pts = []
    for k in range(10):
        r = star.radius if k % 2 == 0 else star.radius * inner_ratio
        a = star.rotation + k * math.pi / 5 - math.pi / 2
        pts.append(((star.x + r * math.cos(a)) * scale, (star.y + r * math.sin(a)) * scale))
    return pts


def render(example: Example) -> Image.Image:
    """Draw the example as an RGB image of size ``(width, height)``."""
    from PIL import Image, ImageDraw

    ss = max(1, example.supersample)
    img = Image.new("RGB", (example.width * ss, example.height * ss), example.background)
    draw = ImageDraw.Draw(img)
    for star in example.stars:
        draw.polygon(star_polygon(star, example.inner_ratio, scale=ss), fill=star.rgb)
    return _reduce_around_stars(img, example, ss) if ss > 1 else img


def _reduce_around_stars(img: Image.Image, example: Example, ss: int) -> Image.Image:
    """``img`` (drawn ``ss`` times larger) box-averaged to the example's size, exactly as
    ``img.resize(size, BOX)`` would, in a fraction of its time: a box of a whole factor averages
    each ``ss``-pixel square alone, so only the squares around the stars are averaged (each star's
    box, on the ``ss`` grid); the rest is background, whose average is itself. Resizing whole
    canvases was half of rendering, and rendering is most of a cold run's data time."""
    from PIL import Image

    out = Image.new("RGB", (example.width, example.height), example.background)
    for star in example.stars:
        # A pixel of margin: the polygon's edge pixels may reach past its outer radius.
        x0, y0 = (max(0, math.floor(c - star.radius) - 1) for c in (star.x, star.y))
        x1 = min(example.width, math.ceil(star.x + star.radius) + 1)
        y1 = min(example.height, math.ceil(star.y + star.radius) + 1)
        square = (x0 * ss, y0 * ss, x1 * ss, y1 * ss)
        out.paste(img.resize((x1 - x0, y1 - y0), Image.Resampling.BOX, box=square), (x0, y0))
    return out


def counts_of(stars: list[Star] | tuple[Star, ...], colours: Mapping[str, Any]) -> dict[str, int]:
    """Recount stars by colour (every colour of ``colours`` present, zero included)."""
    out = dict.fromkeys(colours, 0)
    for s in stars:
        out[s.colour] += 1
    return out


def train_seeds(n: int, start: int = 0) -> list[int]:
    if start < 0 or start + n > VALIDATION_SEED_OFFSET:
        raise ValueError("training seeds would collide with the validation or held-out seeds")
    return list(range(start, start + n))


def validation_seeds(n: int) -> list[int]:
    """Seeds of the first ``n`` validation examples: a fixed range apart from training and held-out,
    so a smaller validation split is a prefix of a larger one (2048/256 inside 4096/512)."""
    if not 0 <= n <= HELDOUT_SEED_OFFSET - VALIDATION_SEED_OFFSET:
        raise ValueError("validation seeds would collide with the held-out seeds")
    return [VALIDATION_SEED_OFFSET + i for i in range(n)]


def heldout_seeds() -> list[int]:
    return [HELDOUT_SEED_OFFSET + i for i in range(HELDOUT_SIZE)]


def train_split(n: int, cfg: StarCountConfig = DEFAULT_CONFIG, start: int = 0) -> list[Example]:
    """Training examples with seeds ``start .. start + n - 1``."""
    return [make_example(s, cfg) for s in train_seeds(n, start)]


def validation_split(n: int, cfg: StarCountConfig = DEFAULT_CONFIG) -> list[Example]:
    """Validation examples with seeds ``VALIDATION_SEED_OFFSET .. + n - 1``."""
    return [make_example(s, cfg) for s in validation_seeds(n)]


def heldout_split(cfg: StarCountConfig = DEFAULT_CONFIG) -> list[Example]:
    """The FIXED 64-example held-out split (seeds ``1_000_000 .. 1_000_063``)."""
    return [make_example(s, cfg) for s in heldout_seeds()]
