"""Link builders: hand cases for the matching rules, brute-force references for the trie walk and the
TF-IDF neighbours, networkx for the link statistics."""

import networkx as nx
import numpy as np
import pytest

from longrag.data import HOTPOTQA_CORPUS, HOTPOTQA_SAMPLE, data_path
from longrag.eval import corpus as C
from longrag.eval import links as L
from longrag.index import titles as T
from longrag.types import Document


def _docs(pairs):
    return [Document(doc_id=str(i), title=t, text=x) for i, (t, x) in enumerate(pairs)]


def _links(docs, **kw):
    return {d.title: d.links for d in T.title_mention_links(docs, **kw)}


def test_title_mentions_word_boundaries_case_and_punctuation():
    docs = _docs([
        ("Lothair II", "Lothair II was a king."),
        ("Teutberga", "Teutberga married LOTHAIR II's court; not Lothair III."),
        ("Bertha", "Berthas and bertha are not her, but Bertha is."),
        ("Ermengarde of Tours", "Mother of lothair ii. See also Bertha."),
        ("Alû", "A demon; Alu and Lothair II."),
        ("Other", "Mentions Alu, Teutberga-like things and ermengarde OF tours."),
    ])
    got = _links(docs)
    assert got["Teutberga"] == ["Lothair II"]  # possessive and case folded, 'Lothair III' is no match
    assert got["Lothair II"] == []  # self mention is not a link
    assert got["Bertha"] == []  # only self mentions
    assert got["Ermengarde of Tours"] == ["Lothair II", "Bertha"]  # ordered by first mention
    assert got["Alû"] == ["Lothair II"]
    assert got["Other"] == ["Alû", "Teutberga", "Ermengarde of Tours"]  # accent folded, hyphen splits


def test_parenthetical_aliases_only_when_unambiguous():
    docs = _docs([
        ("Coney Island Baby (film)", "A 2003 film."),
        ("Lloyd (film)", "A film."),
        ("Lloyd (singer)", "A singer."),
        ("Paris (band)", "A band."),
        ("Paris", "The capital."),
        ("Reader", "I watched Coney Island Baby, met Lloyd in Paris, and saw Lloyd (singer) live."),
    ])
    got = _links(docs)
    # base 'Coney Island Baby' is unique -> links; 'Lloyd' is ambiguous -> only the full title links;
    # 'Paris' belongs to the plain title
    assert got["Reader"] == ["Coney Island Baby (film)", "Paris", "Lloyd (singer)"]
    assert _links(docs, strip_parenthetical=False)["Reader"] == ["Paris", "Lloyd (singer)"]


def test_single_token_titles_need_capital_and_trivial_titles_skipped():
    docs = _docs([
        ("Poison", "A rock band."),
        ("The Who", "Another band."),
        ("It", "A novel."),
        ("The", "An article page."),
        ("Reader", "Rat poison is not the band; Poison is. I like the who and it."),
    ])
    got = _links(docs)
    assert got["Reader"] == ["Poison", "The Who"]  # multi-token titles match case-insensitively
    assert _links(docs, single_token_needs_capital=False)["Reader"] == ["Poison", "The Who"]
    got2 = _links(_docs([("Poison", "x"), ("R", "rat poison")]), single_token_needs_capital=False)
    assert got2["R"] == ["Poison"]


def test_overlapping_mentions_all_count_and_keep_existing():
    docs = _docs([
        ("Bertha, daughter of Lothair II", "x"),
        ("Lothair II", "y"),
        ("Lambert", "Son of Bertha, daughter of Lothair II."),
    ])
    docs[2].links = ["Outside"]
    assert _links(docs)["Lambert"] == ["Bertha, daughter of Lothair II", "Lothair II"]
    assert _links(docs, keep_existing=True)["Lambert"] == ["Outside", "Bertha, daughter of Lothair II", "Lothair II"]
    assert docs[2].links == ["Outside"]  # inputs are not modified


def _brute_force_mentions(matcher, text):
    """Reference: plain substring search of every alias over the space-joined folded tokens."""
    toks = T.tokenize_for_match(text)
    joined = " " + " ".join(f for f, _ in toks) + " "
    starts = {}  # char offset of token start -> token index
    off = 1
    for i, (f, _) in enumerate(toks):
        starts[off] = i
        off += len(f) + 1
    first = {}
    for key, titles in matcher.aliases.items():
        needle = " " + " ".join(key) + " "
        pos = joined.find(needle)
        while pos != -1:
            i = starts[pos + 1]
            guarded = len(key) == 1 and matcher._capital[key] and toks[i][1].islower()
            if not guarded:
                for t in titles:
                    first[t] = min(first.get(t, 1 << 30), i)
            pos = joined.find(needle, pos + 1)
    return set(first)


def test_trie_matches_brute_force_on_hotpotqa_pool():
    docs = C.load_corpus_file(data_path(HOTPOTQA_CORPUS)).documents
    matcher = T.TitleMatcher(d.title for d in docs)
    assert len(matcher.aliases) > 900
    total = 0
    for d in docs[:250]:
        got = matcher.find(d.text)
        assert len(got) == len(set(got))
        assert set(got) == _brute_force_mentions(matcher, d.text), d.title
        total += len(got)
    assert total > 250  # titles are mentioned (each paragraph mentions at least its own title mostly)


def test_tfidf_neighbours_match_dense_brute_force():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(60)]
    docs = _docs([(f"D{i}", " ".join(rng.choice(vocab, size=25))) for i in range(120)])
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = [f"{d.title}\n{d.text}" for d in docs]
    X = TfidfVectorizer(stop_words="english", sublinear_tf=True).fit_transform(texts)
    S = (X @ X.T).toarray()
    np.fill_diagonal(S, -np.inf)
    top_m, thr = 4, 0.15
    out = L.tfidf_neighbour_links(docs, top_m=top_m, threshold=thr, block_size=7)  # several blocks
    by_title = {d.title: i for i, d in enumerate(docs)}
    n_links = 0
    for i, d in enumerate(out):
        got = [by_title[t] for t in d.links]
        order = sorted(range(len(docs)), key=lambda j: (-S[i, j], j))
        ref = [j for j in order[:top_m] if S[i, j] >= thr]
        # similarities equal in order; indices equal unless there is a tie at the cut
        assert np.allclose([S[i, j] for j in got], [S[i, j] for j in ref], atol=1e-6)
        if len(ref) < top_m or S[i, order[top_m - 1]] - S[i, order[top_m]] > 1e-6:
            assert set(got) == set(ref)
        assert i not in got
        n_links += len(got)
    assert 0 < n_links <= top_m * len(docs)
    strict = L.tfidf_neighbour_links(docs, top_m=top_m, threshold=0.99)
    assert all(d.links == [] for d in strict)
    with pytest.raises(ValueError):
        L.tfidf_neighbour_links(docs, top_m=0)


def test_tfidf_degenerate_inputs():
    assert L.tfidf_neighbour_links([]) == []
    one = L.tfidf_neighbour_links(_docs([("A", "solitary text here")]))
    assert one[0].links == []
    empty_vocab = L.tfidf_neighbour_links(_docs([("the", "the"), ("a", "an")]), include_title=True)
    assert [d.links for d in empty_vocab] == [[], []]


def test_link_stats_against_networkx():
    docs = _docs([("A", ""), ("B", ""), ("C", ""), ("D", ""), ("E", "")])
    docs[0].links = ["B", "C", "Missing"]
    docs[1].links = ["A"]
    docs[2].links = ["C"]  # self link ignored
    st = L.link_stats(docs)
    g = nx.DiGraph()
    g.add_nodes_from(d.title for d in docs)
    titles = {d.title for d in docs}
    g.add_edges_from((d.title, t) for d in docs for t in d.links if t in titles and t != d.title)
    assert st["directed_edges"] == g.number_of_edges() == 3
    assert st["undirected_edges"] == g.to_undirected().number_of_edges() == 2
    assert st["isolated_docs"] == len(list(nx.isolates(g))) == 2
    assert st["dangling_links"] == 1 and st["docs_with_outlinks"] == 2


def test_build_links_dispatch():
    docs = _docs([("Alpha Beta", "epsilon zeta gamma"), ("Gamma Delta", "mentions Alpha Beta; epsilon zeta gamma")])
    both = {d.title: d.links for d in L.build_links(docs, "both", tfidf_kwargs={"top_m": 1, "threshold": 0.01})}
    assert both == {"Alpha Beta": ["Gamma Delta"], "Gamma Delta": ["Alpha Beta"]}
    assert L.build_links(docs, "title_mentions")[0].links == []
    with pytest.raises(ValueError):
        L.build_links(docs, "hyperlinks")


def test_title_links_feed_grouping_on_hotpotqa():
    """Links from title mentions drive Algorithm 1: more gold pairs share a grouped unit than by chance."""
    from longrag.eval import datasets as D
    from longrag.index.units import make_units
    from longrag.text.tokens import WhitespaceCounter

    ex = D.load_hotpotqa(data_path(HOTPOTQA_SAMPLE)).examples
    docs = T.title_mention_links(C.pool_examples(ex).documents)
    units = make_units(docs, "grouped", WhitespaceCounter(), budget=2048)
    assert sorted(i for u in units for i in u.doc_ids) == sorted(d.doc_id for d in docs)
    unit_of = {t: k for k, u in enumerate(units) for t in u.titles}
    together = sum(1 for e in ex if len({unit_of[t] for t in e.gold_titles}) == 1)
    assert len(units) < 0.8 * len(docs)
    assert together >= 50  # measured 70+ of 100; without links it would be 0
    plain = make_units(C.pool_examples(ex).documents, "grouped", WhitespaceCounter(), budget=2048)
    assert len(plain) == len(docs)
