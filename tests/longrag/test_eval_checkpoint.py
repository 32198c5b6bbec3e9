"""Reader checkpoints: entries survive a reload, keys depend on every input, a torn line is cut off."""

from longrag.eval.checkpoint import ReaderCheckpoint


def test_add_reload_and_keys(tmp_path, caplog):
    path = tmp_path / "ck.jsonl"
    setup = {"llm": {"model": "m"}, "reader_k": 2}
    ck = ReaderCheckpoint(path, setup)
    assert ck.get("q1", "Who?", ["u1", "u2"]) is None
    ck.add("q1", "Who?", ["u1", "u2"], {"answer": "Orwell", "prompt_tokens": 10})
    ck.add("q2", "When?", ["u3"], {"answer": "1945"})
    with open(path, "a") as fh:
        fh.write('{"key": "torn')  # the write a crash interrupted
    again = ReaderCheckpoint(path, setup)
    assert again.torn == 1
    assert again.get("q1", "Who?", ["u1", "u2"]) == {"answer": "Orwell", "prompt_tokens": 10}
    assert again.get("q2", "When?", ["u3"]) == {"answer": "1945"}
    # any input that changes the answer misses: question text, units (and their order), setup
    assert again.get("q1", "Who wrote it?", ["u1", "u2"]) is None
    assert again.get("q1", "Who?", ["u2", "u1"]) is None
    assert again.get("q1", "Who?", ["u1"]) is None
    assert ReaderCheckpoint(path, {**setup, "reader_k": 3}).get("q2", "When?", ["u3"]) is None
    # the torn line was cut off on opening: a record added after it is readable, the file clean
    again.add("q3", "Where?", ["u4"], {"answer": "Luanda"})
    third = ReaderCheckpoint(path, setup)
    assert third.torn == 0 and third.get("q3", "Where?", ["u4"]) == {"answer": "Luanda"}
    assert len(path.read_text().splitlines()) == 3
    again.remove()
    assert not path.exists()
    again.remove()  # already gone: fine
