"""Prompt templates of the retrieval tasks: the passkey prompt and RULER's NIAH wording.

One copy, below both of their users: the evaluation builds its prompts from them
(`fsframework.eval.passkey`, `fsframework.eval.ruler`) and the embedded corpus
writes training documents in the same formats (`fsframework.data.retrieval_docs`),
so the two stay in step.
"""

from __future__ import annotations

# the passkey prompt (landmark-attention style): instruction line, needle in the filler, question
PASSKEY_HEAD = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                "I will quiz you about the important information there.\n")
PASSKEY_NEEDLE = "The passkey is {key}."
PASSKEY_TAIL = "\nWhat is the passkey? The passkey is"

# RULER's niah wording (RULER `synthetic.yaml`): the noise haystack paragraph, the needle and
# the prompt around the context (plural; `fsframework.eval.ruler` rewords it for a single value)
NIAH_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NIAH_NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
NIAH_TEMPLATE = ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_v} afterwards.\n{context}\nWhat are all the special magic {type_v} "
                 "for {query} mentioned in the provided text? The special magic {type_v} for {query} mentioned in "
                 "the provided text are")
