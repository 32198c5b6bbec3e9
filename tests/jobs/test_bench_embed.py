"""``jobs.bench embed`` run for real, tiny, on this CPU: the product's Embedder over chunk-sized texts,
levels per dtype and batch, vectors of every level checked against the first level's."""

from __future__ import annotations

import json

import pytest

from lab.bench.cli.embed import main, texts


def test_texts_fill_a_chunk_and_cycle():
    two, four = texts(600, 2), texts(3, 4)
    assert len(two) == 600 and two[500] == two[0]  # 1,000 passages give 500 pairs, cycled
    assert all(len(t.split()) > 150 for t in two[:20]) and len(four[0].split()) > 2 * len(two[0].split()) * 0.8
    assert two[0].startswith('"') and "\n" in two[0]  # the first passage's '"Title"' line leads


@pytest.mark.slow
def test_levels_and_the_json_line(capsys):
    assert main(["--device", "cpu", "--chunks", "8", "--batch-sizes", "4,8", "--dtypes", "float32,bfloat16",
                 "--torch-threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["device"] == "cpu" and out["gpu"] is None and out["tokens_per_chunk_mean"] > 200
    levels = out["levels"]
    assert [(r["dtype"], r["batch"]) for r in levels] == [("float32", 4), ("float32", 8), ("bfloat16", 4), ("bfloat16", 8)]
    assert all(r["chunks"] == 8 and r["chunks_per_s"] > 0 and r["tokenize_only_chunks_per_s"] > 0 for r in levels)
    assert levels[1]["min_cosine_vs_first"] > 0.9999  # the same dtype, another batch size: the same vectors
    assert 0.99 < levels[2]["min_cosine_vs_first"] < 0.99999  # bfloat16: close, not equal


def test_bad_options_exit_with_a_message(capsys):
    with pytest.raises(SystemExit):
        main(["--dtypes", "int8"])
    assert "int8" in capsys.readouterr().err


@pytest.mark.slow
def test_a_random_shape_is_measured_and_its_folder_removed(monkeypatch, capsys, tmp_path):
    """--random-shape: a BERT of the shape with random weights and the bundled tokenizer, measured
    like any encoder, its temporary folder gone afterwards (a small shape stands in for bge-large)."""
    import tempfile

    import lab.bench.cli.embed as be

    monkeypatch.setitem(be.SHAPES, "tiny", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=128, max_position_embeddings=512))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert be.main(["--random-shape", "tiny", "--device", "cpu", "--chunks", "4", "--batch-sizes", "4",
                    "--passages-per-chunk", "4", "--torch-threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "tiny" in out["model"] and out["tokens_per_chunk_mean"] > 400  # 512-token inputs, not MiniLM's 256
    assert out["levels"][0]["chunks_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # the random model's folder removed
