"""Draft tokens for a decode step to verify: n-gram lookup in the sequence's own text, or a smaller draft model
run through its own model runner. Imports `execution/` and everything below it."""
