"""The demo judges its answers against the gold answers of its questions."""

from jobs.demo import QUESTIONS, is_correct


def test_is_correct_accepts_aliases_and_ignores_case_and_articles():
    golds = dict(QUESTIONS)["Which country is Aruba a constituent country of?"]
    assert is_correct("The Netherlands.", golds)
    assert is_correct("a constituent country of the Kingdom of the Netherlands", golds)
    assert not is_correct("the United Kingdom", golds)
    assert is_correct("George Orwell", dict(QUESTIONS)["Who wrote the novel Animal Farm?"])
    assert not is_correct("The Beatles were born in Liverpool", dict(QUESTIONS)["Who wrote the novel Animal Farm?"])
    assert not is_correct("", ("Apollo 11",))
