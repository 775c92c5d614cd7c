"""Calibration text written for this project, for methods that fit something to a model's activations.

Never evaluation data: no task reads these passages, and they share no run of 8 words with the license texts in
/usr/share/common-licenses that the ppl, niah, asr and longbench-e tasks cut their items from
(tests/quant/test_together_oscar.py checks it). Each passage is one calibration sequence. Their kinds follow the
prompts Together AI's OSCAR calibrated on (GPQA: graduate-level multiple-choice science questions), written here
from scratch, with narrative, dialogue, code and a table of numbers beside them.

A set is named (`SOURCES`) and identified by its digest (`digest`): a method that calibrates on it records both in
its config, so a change to the text changes the identity of every result that used it.
"""

from __future__ import annotations

import hashlib

PROSE_V1: tuple[str, ...] = (
    "Question: A thin uniform rod of mass M and length L hangs from a frictionless pivot at one end. A small lump of "
    "clay of mass m, moving horizontally with speed u, strikes the free end and sticks to it. Immediately after the "
    "collision, what is the angular speed of the rod and clay about the pivot? Choices: (A) 3mu / ((M + 3m) L) "
    "(B) mu / ((M + m) L) (C) 3mu / ((3M + m) L) (D) 2mu / ((M + 2m) L). Reasoning: angular momentum about the pivot "
    "is conserved during the brief impact, because the force at the pivot exerts no torque about that point. Before "
    "the impact the clay carries m u L. Afterwards the moment of inertia is M L^2 / 3 for the rod plus m L^2 for the "
    "clay, so the angular speed equals m u L divided by (M / 3 + m) L^2, which simplifies to 3 m u / ((M + 3m) L). "
    "The answer is (A). Linear momentum is not conserved here, since the pivot pushes back on the rod during the "
    "collision, and some kinetic energy goes into deforming the clay.",
    "Question: An aqueous solution is prepared by dissolving 0.10 mol of acetic acid and 0.05 mol of sodium hydroxide "
    "in enough water to make one litre. The acid dissociation constant of acetic acid is 1.8 x 10^-5 at 25 degrees "
    "Celsius. What is the pH of the resulting solution? Choices: (A) 2.87 (B) 4.74 (C) 7.00 (D) 9.26. Reasoning: the "
    "hydroxide neutralizes half of the acid, leaving 0.05 mol of acetic acid and 0.05 mol of acetate. Equal amounts "
    "of a weak acid and its conjugate base make a buffer whose pH equals the pKa, by the Henderson-Hasselbalch "
    "relation. The negative logarithm of 1.8 x 10^-5 is about 4.74, so the answer is (B). Choice (A) is the pH of the "
    "acid alone at 0.10 molar, and (D) is the pKb of acetate, fourteen minus the pKa, mistaken for a pH.",
    "Question: In a population of flowering plants at Hardy-Weinberg equilibrium, 16 percent of individuals show the "
    "recessive white-petal phenotype. What fraction of the plants are heterozygous carriers of the white allele? "
    "Choices: (A) 0.16 (B) 0.24 (C) 0.48 (D) 0.60. Reasoning: the frequency of homozygous recessive plants is q "
    "squared, so q equals the square root of 0.16, which is 0.4, and p equals 0.6. Heterozygotes occur at frequency "
    "2pq, that is 2 times 0.6 times 0.4, giving 0.48. The answer is (C). The equilibrium assumes random mating, a "
    "large population, no selection, no migration and no new mutation; a greenhouse that cross-pollinates only its "
    "tallest plants would break the first of these at once.",
    "The night train left the coast at ten past nine, half empty, its windows fogged with the breath of sleeping "
    "passengers. In the third carriage a retired surveyor named Odile unfolded a map so old that the rivers on it had "
    "since changed course. She traced the railway with a pencil, marking each station as it passed: a village of "
    "slate roofs, a quarry lit by a single lamp, a bridge over a gorge where the wind made the carriage sway. Across "
    "the aisle a boy of about twelve watched her with open curiosity. When the conductor came through to punch the "
    "tickets, the boy asked him how the driver could see the track in the dark. The conductor laughed, said the "
    "driver knew every curve by heart, and that the signals spoke to him in colours: green to go, yellow to slow "
    "down, red to stop and wait. Near midnight the train began to climb. Snow appeared along the embankment, first "
    "in thin grey ribbons, then in drifts taller than a man, and Odile folded her map away.",
    "User: My sourdough loaf comes out dense and flat. I feed the starter every morning and bake in the evening. What "
    "am I doing wrong?\nAssistant: A few things are worth checking. First, the starter should be at its peak when you "
    "mix the dough, roughly doubled and full of bubbles; if it has already collapsed, it has eaten its food and the "
    "rise will be weak. Second, the bulk fermentation is probably too short or too cold. At a kitchen temperature of "
    "about 21 degrees, expect four to six hours, and judge by the dough rather than the clock: it should grow by half, "
    "feel airy, and show bubbles on the sides of the bowl. Third, shaping matters. Build surface tension by folding "
    "the edges toward the centre and rolling the dough against the counter until the skin is tight. Finally, bake in "
    "a preheated covered pot for the first twenty minutes so the steam lets the crust expand before it sets.\nUser: "
    "Should I add more yeast?\nAssistant: No need. Give the culture you have more time and warmth first, and keep "
    "notes of each bake so you can see which change helped.",
    "The following function merges overlapping intervals. It sorts the intervals by their start, then walks through "
    "them once, extending the last merged interval whenever the next one begins before it ends.\n\n"
    "def merge(intervals):\n    merged = []\n    for start, end in sorted(intervals):\n"
    "        if merged and start <= merged[-1][1]:\n            merged[-1][1] = max(merged[-1][1], end)\n"
    "        else:\n            merged.append([start, end])\n    return merged\n\n"
    "print(merge([(8, 10), (1, 3), (2, 6), (15, 18)]))  # [[1, 6], [8, 10], [15, 18]]\n\n"
    "Sorting costs O(n log n) and the single pass costs O(n), so the whole routine runs in O(n log n) time with O(n) "
    "extra memory. A common mistake is to compare each interval only with its neighbour in the order it arrived, "
    "which misses overlaps between intervals that stood far apart before sorting.",
    "Monthly rainfall at the hill station, in millimetres: January 212, February 187, March 143, April 96, May 41, "
    "June 12, July 3, August 7, September 30, October 118, November 205, December 241. The annual total is 1,295 mm, "
    "and the wettest quarter, November to January, brings 658 mm, just over half. Mean daily temperatures range from "
    "4.5 degrees in January to 19.8 degrees in July. The observers note that the 1998 record of 96 mm in a single day "
    "still stands, and that the dry season has lengthened by about nine days per decade since the station opened in "
    "1961. Readings are taken at 09:00 local time from a copper gauge set 30 cm above the ground, and any snowfall is "
    "melted indoors before it is measured.",
    "Before standard time, every town kept its own noon, set by the moment the sun stood highest over the local "
    "church or town hall. A traveller going west by coach gained a few minutes at each stop and hardly noticed. The "
    "railways changed that. A timetable listing dozens of local times was a puzzle for passengers and a danger for "
    "the signalmen who had to keep two trains from meeting on a single track. In the eighteen-forties British "
    "railway companies began to run on the time of the Greenwich observatory, sent down the line by telegraph, and "
    "the towns slowly followed. Clocks on some market halls were given two minute hands, one for local time and one "
    "for railway time. In North America the railroads agreed on four time zones in 1883, decades before governments "
    "made them law. A technical system that links distant places closely enough can force a shared convention on "
    "people who never asked for one.",
    "Question: How many ways can eight identical coins be placed in three distinct boxes so that every box receives "
    "at least one coin? Choices: (A) 21 (B) 28 (C) 36 (D) 45. Reasoning: put one coin in each box first, leaving five "
    "coins to place freely. By the stars-and-bars argument, the number of ways to put five identical items into three "
    "boxes is seven choose two, which is 21. The answer is (A). Without the restriction the count would be ten choose "
    "two, or 45, which is choice (D).",
    "Question: A star has the same surface temperature as the Sun but a radius three times larger. How does its "
    "luminosity compare with the Sun's? Choices: (A) 3 times (B) 9 times (C) 27 times (D) 81 times. Reasoning: by "
    "the Stefan-Boltzmann law, luminosity is proportional to the radius squared times the fourth power of the "
    "temperature. With the temperature unchanged, tripling the radius multiplies the luminosity by nine, so the "
    "answer is (B). Doubling the temperature at a fixed radius, by contrast, would raise the luminosity sixteen-fold, "
    "which is why hot blue stars outshine red ones of similar size.",
)

SOURCES: dict[str, tuple[str, ...]] = {"project-prose-v1": PROSE_V1}


def passages(name: str) -> tuple[str, ...]:
    """The passages of calibration set `name` (a key of SOURCES)."""
    if name not in SOURCES:
        raise ValueError(f"unknown calibration text {name!r}; known: {', '.join(SOURCES)}")
    return SOURCES[name]


def digest(name: str) -> str:
    """SHA-256 of set `name`'s passages (UTF-8, joined by a NUL, which no passage holds), first 16 hex digits."""
    return hashlib.sha256("\0".join(passages(name)).encode()).hexdigest()[:16]
