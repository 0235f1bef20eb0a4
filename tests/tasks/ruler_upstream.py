# Copyright (c) 2024, NVIDIA CORPORATION.  All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License
"""NVIDIA/RULER's published prompt text, vendored for tests/tasks/test_ruler_prompts.py (the test's other side).

Copied from github.com/NVIDIA/RULER (commit c3f5e3b): `TASKS` from scripts/data/synthetic/constants.py (templates,
answer prefixes, tokens_to_generate), the task settings of scripts/synthetic.yaml, the needle sentence and the
noise haystack of scripts/data/synthetic/niah.py, `DOCUMENT_PROMPT` of qa.py; and, as functions, how RULER
assembles a prompt from them: prepare.py (`template + answer_prefix`, the base model template), niah.py's
singular wording, common_words_extraction.py's few-shot example, variable_tracking.py's in-context example,
qa.py's documents. kvbench's code is not imported here.
"""

TASKS = {
    'niah': {
        'tokens_to_generate': 128,
        'template': """Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?""",
        'answer_prefix': """ The special magic {type_needle_v} for {query} mentioned in the provided text are"""
    },

    'variable_tracking': {
        'tokens_to_generate': 30,
        'template': """Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.""",
        'answer_prefix': """ Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value {query}, they are: """
    },

    'common_words_extraction': {
        'tokens_to_generate': 120,
        'template': """Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?""",
        'answer_prefix': """ Answer: The top 10 words that appear most often in the list are:"""
    },

    'freq_words_extraction' : {
        'tokens_to_generate': 50,
        'template': """Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?""",
        'answer_prefix': """ Answer: According to the coded text above, the three most frequently appeared words are:"""
    },

    'qa': {
        'tokens_to_generate': 32,
        'template': """Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}""",
        'answer_prefix': """ Answer:""",
    },
}

# scripts/synthetic.yaml: task -> (RULER task, args); niah's defaults: 1 key, 1 value, 1 query, words -> numbers
NIAH = {"type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}
SYNTHETIC = {
    "niah_single_1": ("niah", {**NIAH, "type_haystack": "noise"}),
    "niah_single_2": ("niah", {**NIAH, "type_haystack": "essay"}),
    "niah_single_3": ("niah", {**NIAH, "type_haystack": "essay", "type_needle_v": "uuids"}),
    "niah_multikey_1": ("niah", {**NIAH, "type_haystack": "essay", "num_needle_k": 4}),
    "niah_multikey_2": ("niah", {**NIAH, "type_haystack": "needle"}),
    "niah_multikey_3": ("niah", {**NIAH, "type_haystack": "needle", "type_needle_k": "uuids", "type_needle_v": "uuids"}),
    "niah_multivalue": ("niah", {**NIAH, "type_haystack": "essay", "num_needle_v": 4}),
    "niah_multiquery": ("niah", {**NIAH, "type_haystack": "essay", "num_needle_q": 4}),
    "vt": ("variable_tracking", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
    "cwe": ("common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    "fwe": ("freq_words_extraction", {"alpha": 2.0}),
    "qa_1": ("qa", {"dataset": "squad"}),
    "qa_2": ("qa", {"dataset": "hotpotqa"}),
}

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."  # niah.py
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."  # niah.py
DOCUMENT_PROMPT = "Document {i}:\n{document}"  # qa.py


def template(task: str) -> str:
    """prepare.py: Templates['base'].format(task_template=template) + answer_prefix, then niah.py's singular
    wording when one value is asked."""
    kind, args = SYNTHETIC[task]
    text = TASKS[kind]['template'] + TASKS[kind].get('answer_prefix', '')
    if kind == "niah" and args["num_needle_q"] * args["num_needle_v"] == 1:
        text = text.replace('Some', 'A')
        text = text.replace('are all', 'is')
        text = text.replace('are', 'is')
        text = text.replace('answers', 'answer')
    return text


def niah_input(task: str, context: str, query: str) -> str:
    kind, args = SYNTHETIC[task]
    type_needle_v = args["type_needle_v"]
    if args["num_needle_q"] * args["num_needle_v"] == 1:
        type_needle_v = type_needle_v[:-1]  # remove "s"
    return template(task).format(type_needle_v=type_needle_v, context=context, query=query)


def cwe_input(example_context: str, example_answer: list[str], context: str, num_cw: int = 10) -> str:
    """common_words_extraction.py's generate_input_output, one few-shot example."""
    few_shot = template("cwe").format(num_cw=num_cw, context=example_context, query='') + ' ' + ' '.join(
        [f"{i + 1}. {word}" for i, word in enumerate(example_answer)])
    return few_shot + "\n" + template("cwe").format(num_cw=num_cw, context=context, query='')


def vt_input(icl_context: str, icl_value: str, icl_vars: list[str], context: str, value: str, num_hops: int = 4):
    """variable_tracking.py: the example's input (template + answer prefix), ' ', its answer, '\\n', inserted
    before the task's template with a '\\n' (sys_vartrack_w_noise_random, randomize_icl)."""
    icl = template("vt").format(context=icl_context, query=icl_value, num_v=num_hops + 1)
    icl_example = icl + " " + ' '.join(icl_vars) + '\n'
    return icl_example + '\n' + template("vt").format(context=context, query=value, num_v=num_hops + 1)


def fwe_input(context: str) -> str:
    return template("fwe").format(context=context, query='')


def qa_input(documents: list[str], query: str) -> str:
    context = '\n\n'.join([DOCUMENT_PROMPT.format(i=i + 1, document=d) for i, d in enumerate(documents)])
    return template("qa_1").format(context=context, query=query)
