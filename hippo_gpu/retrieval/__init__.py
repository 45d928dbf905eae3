"""Queries -> ranked passages: the Searcher and the spec that opens one, HippoRAG 2's seeds and
passage PPR, the entity-seeded rankings (hybrid, HippoRAG 1), explanations, IRCoT and the batch
jobs over a query file."""
