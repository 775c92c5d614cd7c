"""LongBench-E's per-dataset settings, transcribed from THUDM/LongBench (LongBench/config/dataset2prompt.json,
dataset2maxlen.json, pred.py and eval.py at 2e00731): the 13 English and code sets in pred.py's `--e` order, each
set's prompt template (filled with `str.format(**row)`), its answer budget, whether the chat template is skipped and
which metric scores it."""

from __future__ import annotations

DATASETS: tuple[str, ...] = (
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "gov_report",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)

_QASPER_RULES = (
    "Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question "
    'cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no '
    'question, answer "yes", "no", or "unanswerable". Do not provide any explanation.'
)
_QASPER_AGAIN = (
    "Answer the question based on the above article as concisely as you can, using a single phrase or sentence if "
    'possible. If the question cannot be answered based on the information in the article, write "unanswerable". If '
    'the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.'
)
_PASSAGES = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
)
_COUNT = (
    "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read "
    "these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, "
    "how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique "
    "paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so "
    "on.\n\nThe final answer is: "
)
_RETRIEVAL = (
    "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is "
    "from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph that "
    'the abstract is from. The answer format must be like "Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: '
)

PROMPTS: dict[str, str] = {
    "qasper": f"You are given a scientific article and a question. {_QASPER_RULES}\n\nArticle: {{context}}\n\n "
    f"{_QASPER_AGAIN}\n\nQuestion: {{input}}\n\nAnswer:",
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question "
    "based on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\n"
    "Answer:",
    "hotpotqa": f"{_PASSAGES}\n\nThe following are given passages.\n{{context}}\n\n{_PASSAGES}\n\n"
    "Question: {input}\nAnswer:",
    "2wikimqa": f"{_PASSAGES}\n\nThe following are given passages.\n{{context}}\n\n{_PASSAGES}\n\n"
    "Question: {input}\nAnswer:",
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
    "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
    "Now, write a one-page summary of all the news.\n\nSummary:",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n"
    "{context}\n{input}",
    "triviaqa": "Answer the question based on the given passage. Only give me the answer and do not output any other "
    "words. The following are some examples.\n\n{context}\n\n{input}",
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n"
    "{context}\n\n{input}",
    "passage_count": _COUNT,
    "passage_retrieval_en": _RETRIEVAL,
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

MAX_NEW_TOKENS: dict[str, int] = {
    "qasper": 128,
    "multifieldqa_en": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "gov_report": 512,
    "multi_news": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "lcc": 64,
    "repobench-p": 64,
}

# pred.py: "chat models are better off without build prompts on these tasks" (few-shot and code sets).
NO_CHAT: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lcc", "repobench-p"})
# eval.py: only the first line of the prediction (after leading newlines) is scored for these.
FIRST_LINE: frozenset[str] = frozenset({"trec", "triviaqa", "samsum"})

# eval.py's dataset2metric, by name (tasks/longbench_e/score.py holds the functions).
METRICS: dict[str, str] = {
    "qasper": "qa_f1",
    "multifieldqa_en": "qa_f1",
    "hotpotqa": "qa_f1",
    "2wikimqa": "qa_f1",
    "gov_report": "rouge",
    "multi_news": "rouge",
    "trec": "classification",
    "triviaqa": "qa_f1",
    "samsum": "rouge",
    "passage_count": "count",
    "passage_retrieval_en": "retrieval",
    "lcc": "code_sim",
    "repobench-p": "code_sim",
}

# model2maxlen.json's prompt budgets: a model's context (4k, 8k, 16k, 32k) less room for the answer.
MODEL_MAX_LENGTHS: dict[int, int] = {4096: 3500, 8192: 7500, 16384: 15500, 32768: 31500}
