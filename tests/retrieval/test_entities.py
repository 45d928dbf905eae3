from hippo_gpu.retrieval.entities import capitalized_spans, heuristic_entities


def test_capitalised_spans_keep_connectors_and_drop_question_words():
    q = "Who was the first president of the association which published Journal of Psychotherapy Integration?"  # noqa: E501
    assert capitalized_spans(q) == ["Journal of Psychotherapy Integration"]
    assert capitalized_spans("When did The Beatles play at Shea Stadium?") == \
        ["The Beatles", "Shea Stadium"]
    assert capitalized_spans("what is it?") == []
    assert heuristic_entities(["Paris", "x"]) == [["Paris"], []]
    assert capitalized_spans("Paris or Paris") == ["Paris"]
