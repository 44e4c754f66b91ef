"""lm-eval metric for facts_gen: whether the reply names the answer (a small model answers in a sentence)."""


def process_results(doc: dict, results: list[str]) -> dict:
    return {"contains_answer": float(doc["answer_text"].lower() in results[0].lower())}
