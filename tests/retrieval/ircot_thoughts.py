"""The bundled sample's four 3-hop questions and natural IRCoT thoughts for each (what a
scripted LLM answers, step by step); Q2's thoughts never say the answer."""

from __future__ import annotations

import json
from typing import Any

from hippo_gpu.sample import paths

QUESTIONS = [q["question"] for q in json.loads(paths()["questions"].read_text())]
Q1, Q2, Q3, Q4 = QUESTIONS
SCRIPT: dict[str, list[Any]] = {
    Q1: ["The tidal clock was invented by Marta Quill.", "Marta Quill was born in Harrowgate.",
         "Harrowgate lies on the River Selden. So the answer is: River Selden."],
    Q2: ["The director of the Lumen Museum is Edwin Pell.",
         "Edwin Pell studied at Castellan College.", "Castellan College has a founder."],
    Q3: ["Varnholt is the capital of Eastmere.",
         "The governor of Eastmere is Tomas Reyne, born in Millbrook. So the answer is: "
         "Millbrook."],
    Q4: ["The Lumen Museum is in Varnholt.", "The Ondra ferry connects Varnholt with Skerrow.",
         "The lighthouse on Skerrow was designed by Jonas Vell. So the answer is: Jonas Vell."],
}
