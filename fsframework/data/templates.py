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

# RULER's other tasks (`scripts/data/synthetic/constants.py`): each template is RULER's task
# template followed by its answer prefix, as RULER joins them for a base model; `{context}` is
# the haystack, the other fields are filled per sample (`fsframework.eval.ruler_vt`,
# `fsframework.eval.ruler_words`, `fsframework.eval.ruler_qa`)
VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above. Answer: According "
               "to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value "
               "{query}, they are: ")
CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
                "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
                "list? Answer: The top 10 words that appear most often in the list are:")
FWE_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
                "the dots '....'. What are the three most frequently appeared words in the above coded text? Answer: "
                "According to the coded text above, the three most frequently appeared words are:")
QA_TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
               "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
               "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:")
QA_DOCUMENT = "Document {i}:\n{document}"
