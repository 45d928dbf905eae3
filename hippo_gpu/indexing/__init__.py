"""From a corpus and its OpenIE to an Index (build): graph elements and the CSR graph (graph),
synonym edges from a kNN or a threshold join (synonyms, vector_search, cosine_join), and the
Index itself, plain data (index)."""
