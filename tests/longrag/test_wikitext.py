"""MediaWiki export reading: markup stripping, links, redirects, lead mode, the shipped sample."""

from __future__ import annotations

import bz2
from pathlib import Path

import pytest

from longrag.corpus.documents import read_documents
from longrag.corpus.wikimarkup import wikitext_to_text
from longrag.corpus.wikitext import parse_page, read_wikixml
from longrag.corpus.wikititles import link_target, normalize_title, resolve_redirects, resolve_title
from longrag.corpus.wikixml import RawPage, iter_pages
from longrag.data import SAMPLE_WIKI, data_path
from longrag.types import Document

SAMPLE = data_path(SAMPLE_WIKI)  # the bundled enwiki excerpt (data/sample/ATTRIBUTION.md)

ALPHA = """{{Infobox thing|name=Alpha|country=[[Gamma Land]]}}
'''Alpha''' is a [[beta_test|test ''subject'']] linked to [[Delta#History|the delta]] and [[Redirect One]].<ref>{{cite web|url=http://x.org|title=[[Ref Target]]}}</ref> It was [[File:Alpha.jpg|thumb|A [[Caption Link]] picture]] studied in [[:fr:Alpha|France]][[fr:Alpha]] and [[wikt:alpha|Wiktionary]] and in [[Alpha]] itself (see [[#History]]). It is {{convert|5|km}} long.
{| class="wikitable"
|-
| cell [[Table Link]] || two
|}

== History ==
The [[Epsilon]] era.<!-- hidden [[Comment Link]] -->
See [[Category:Letters]] and [[:Category:Letters|the list]].
[[Category:Letters]]
"""

BETA = """'''Beta test''' points at [[Loop A]], at [[Alpha]], again at [[alpha]], at itself [[Beta_test]] and through [[Beta redirect]].
"""

DELTA = """{{Short description|a letter}}
'''Delta''' is linked back to [[alpha]].

==Section==
Body of delta.
"""


def _page(title: str, pid: int, text: str = "", ns: int = 0, redirect: str | None = None) -> str:
    red = f'    <redirect title="{redirect}" />\n' if redirect is not None else ""
    esc = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        f"  <page>\n    <title>{title}</title>\n    <ns>{ns}</ns>\n    <id>{pid}</id>\n{red}"
        f"    <revision>\n      <id>{pid * 100}</id>\n      <text xml:space=\"preserve\">{esc}</text>\n"
        f"    </revision>\n  </page>\n"
    )


def _export(pages: list[str], ns_uri: str | None = "http://www.mediawiki.org/xml/export-0.11/") -> str:
    attr = f' xmlns="{ns_uri}"' if ns_uri else ""
    return f'<mediawiki{attr} version="0.11" xml:lang="en">\n  <siteinfo><sitename>T</sitename></siteinfo>\n' + "".join(pages) + "</mediawiki>\n"


PAGES = [
    _page("Alpha", 1, ALPHA),
    _page("Beta test", 2, BETA),
    _page("Delta", 3, DELTA),
    _page("Redirect One", 10, "#REDIRECT [[Redirect Two]]", redirect="Redirect Two"),
    _page("Redirect Two", 11, "#redirect [[Delta#Section]]"),  # no <redirect> element: found in the text
    _page("Loop A", 12, "#REDIRECT [[Loop B]]", redirect="Loop B"),
    _page("Loop B", 13, "#REDIRECT [[Loop A]]", redirect="Loop A"),
    _page("Beta redirect", 14, "#REDIRECT [[Beta test]]", redirect="Beta test"),
    _page("Wikipedia:About", 20, "Project page [[Alpha]]", ns=4),
    _page("Talk:Alpha", 21, "Talk page", ns=1),
]


@pytest.fixture
def export(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.xml"
    p.write_text(_export(PAGES), encoding="utf-8")
    return p


def test_normalize_title() -> None:
    assert normalize_title("foo_bar  baz") == "Foo bar baz"
    assert normalize_title("  ñandú \t") == "Ñandú"
    assert normalize_title("iPhone") == "IPhone"  # MediaWiki first-letter case
    assert normalize_title("Already Fine") == "Already Fine"
    assert normalize_title("ßtraße") == "ßtraße"  # no single-letter upper case: kept
    assert normalize_title("") == ""
    with pytest.raises(ValueError):
        normalize_title(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw, want",
    [
        ("File:x.jpg", None),
        ("image:x.jpg", None),
        ("Category:Letters", None),
        (":Category:Letters", None),
        ("fr:Paris", None),
        (":fr:Paris", None),
        ("zh-yue:Paris", None),
        ("wikt:alpha", None),
        ("Help:Contents", None),
        ("WP:RCAT", None),
        ("#History", None),
        ("{{tpl}}", None),
        ("Star Wars: Episode IV", "Star Wars: Episode IV"),
        ("Pi: a film", "Pi: a film"),
        ("V: The Final Battle", "V: The Final Battle"),  # one-letter interwiki prefixes only in lower case
        ("s:Some text", None),
        ("d:Q42", None),
        ("delta#History", "Delta"),
        (":delta", "Delta"),
        ("foo%20bar", "Foo bar"),
        ("AT&amp;T", "AT&T"),
        ("new_york  city", "New york city"),
    ],
)
def test_link_target(raw: str, want: str | None) -> None:
    assert link_target(raw) == want


def test_iter_pages_main_namespace_and_redirects(export: Path) -> None:
    pages = list(iter_pages(export))
    assert [p.title for p in pages] == [
        "Alpha", "Beta test", "Delta", "Redirect One", "Redirect Two", "Loop A", "Loop B", "Beta redirect",
    ]
    by = {p.title: p for p in pages}
    assert by["Alpha"].page_id == "1" and by["Alpha"].ns == 0 and by["Alpha"].redirect is None
    assert by["Redirect One"].redirect == "Redirect Two"
    assert by["Redirect Two"].redirect == "Delta"  # from '#redirect [[Delta#Section]]'
    assert "{{Infobox thing" in by["Alpha"].wikitext  # raw text, entities decoded
    assert RawPage.from_row(by["Alpha"].to_row()) == by["Alpha"]
    assert {p.ns for p in iter_pages(export, namespaces=(1, 4))} == {1, 4}


def test_iter_pages_without_xml_namespace_and_bz2(tmp_path: Path) -> None:
    p = tmp_path / "plain.xml.bz2"
    p.write_bytes(bz2.compress(_export(PAGES[:2], ns_uri=None).encode()))
    assert [r.title for r in iter_pages(p)] == ["Alpha", "Beta test"]


def test_parse_page_strips_markup(export: Path) -> None:
    raw = next(iter_pages(export))
    doc = parse_page(raw)
    assert doc.doc_id == "1" and doc.title == "Alpha"
    t = doc.text
    assert t.startswith("Alpha is a test subject linked to the delta and Redirect One.")
    assert "It is 5 km long." in t
    assert "History" in t.splitlines()  # heading kept as its own plain line
    assert "The Epsilon era." in t
    assert "the list" in t  # [[:Category:X|label]] is a visible link to a category page
    for gone in ("Infobox", "Gamma", "cite", "x.org", "Ref Target", "thumb", "Caption", "Alpha.jpg", "cell",
                 "Table Link", "hidden", "Comment", "Category", "Letters", "{", "}", "[", "]", "<", "''"):
        assert gone not in t, gone
    assert "studied in France and Wiktionary and in Alpha itself (see History)." in t


def test_links_all_and_text_scope(export: Path) -> None:
    raw = next(iter_pages(export))
    all_links = parse_page(raw).links
    assert all_links == [
        "Gamma Land", "Beta test", "Delta", "Redirect One", "Ref Target", "Caption Link", "Table Link", "Epsilon",
    ]  # document order; no File/Category/interwiki/self/anchor-only links; the comment's link is not a link
    text_links = parse_page(raw, link_scope="text").links
    assert text_links == ["Beta test", "Delta", "Redirect One", "Epsilon"]


def test_lead_mode(export: Path) -> None:
    raw = next(iter_pages(export))
    doc = parse_page(raw, text_mode="lead")
    assert "Epsilon" not in doc.text and "History" not in doc.text.splitlines()
    assert doc.text.startswith("Alpha is a test subject")
    assert "Epsilon" not in doc.links
    assert doc.links == ["Gamma Land", "Beta test", "Delta", "Redirect One", "Ref Target", "Caption Link", "Table Link"]
    assert parse_page(raw, text_mode="lead", link_scope="text").links == ["Beta test", "Delta", "Redirect One"]
    with pytest.raises(ValueError, match="text_mode"):
        parse_page(raw, text_mode="abstract")  # type: ignore[arg-type]


def test_lead_heading_inside_comment_is_not_a_section() -> None:
    wt = "Lead [[One]] <!--\n== Not a heading ==\n--> still lead [[Two]].\n\n== Real ==\nBody [[Three]]."
    text, links = wikitext_to_text(wt, text_mode="lead")
    assert text == "Lead One still lead Two."
    assert links == ["One", "Two"]
    wt2 = "{{Infobox\n|a=[[One]]\n== inside ==\n}}\nLead.\n==Real==\nBody [[Three]]"
    text2, links2 = wikitext_to_text(wt2, text_mode="lead")
    assert text2 == "Lead." and links2 == ["One"]


def test_lists_breaks_and_blocks() -> None:
    wt = "Intro:\n* [[One]] item\n* <span>two</span>\n;Term\n: definition<br/>next\n<div>block</div>after __NOTOC__"
    text, links = wikitext_to_text(wt)
    assert text == "Intro:\nOne item\ntwo\nTerm\ndefinition\nnext\n\nblock\nafter"
    assert links == ["One"]
    text, _ = wikitext_to_text("'''Bold''' and ''italic'' and '''''both''''' (; {{IPA|x}}, ''Akh'', ) end &amp; &nbsp;x")
    assert text == "Bold and italic and both (Akh) end & x"


def test_parse_page_errors() -> None:
    with pytest.raises(ValueError, match="redirect"):
        parse_page(RawPage("R", 0, "5", "Target", "#REDIRECT [[Target]]"))
    with pytest.raises(ValueError, match="no text"):
        parse_page(RawPage("Empty", 0, "6", None, "{{Only a template}}\n[[Category:X]]"))
    with pytest.raises(ValueError, match="no page id"):
        parse_page(RawPage("No id", 0, "", None, "text"))


def test_resolve_redirects_chain_cycle_self() -> None:
    red = {"A1": "A2", "A2": "Target", "Loop_a": "Loop b", "Loop b": "Loop a", "Me2": "Me", "Selfie": "Selfie"}
    assert resolve_title("a1", red) == "Target"
    assert resolve_title("Loop a", red) == "Loop a"
    assert resolve_title("Selfie", red) == "Selfie"
    docs = [Document("1", "Me", "x", ["A1", "Target", "a2", "Loop a", "Me2", "Me", "Selfie", "Other"])]
    out = resolve_redirects(docs, red)
    assert out[0].links == ["Target", "Loop a", "Selfie", "Other"]
    assert docs[0].links[0] == "A1"  # inputs are not modified


def test_read_wikixml_end_to_end(export: Path) -> None:
    docs, rep = read_wikixml(export)
    by = {d.title: d for d in docs}
    assert set(by) == {"Alpha", "Beta test", "Delta"}
    assert [d.doc_id for d in docs] == ["1", "2", "3"]
    # Redirect One -> Redirect Two -> Delta (already linked: de-duplicated)
    assert by["Alpha"].links == ["Gamma Land", "Beta test", "Delta", "Ref Target", "Caption Link", "Table Link", "Epsilon"]
    # Loop A is a cycle (left as written), alpha == Alpha, self links (direct and via redirect) dropped
    assert by["Beta test"].links == ["Loop A", "Alpha"]
    assert by["Delta"].links == ["Alpha"]
    assert rep.n_ok == 3 and rep.n_bad == 0
    assert rep.stats["n_redirects"] == 5
    assert rep.stats["n_links_in_corpus"] == 2 + 1 + 1
    docs2, _ = read_documents(export, "wikixml", text_mode="lead")
    assert {d.title: d.links for d in docs2}["Delta"] == ["Alpha"]
    assert "Body" not in {d.title: d.text for d in docs2}["Delta"]


def test_read_wikixml_truncated_file_reports(tmp_path: Path) -> None:
    xml = _export(PAGES)
    cut = xml.index("<title>Delta</title>") + 30
    p = tmp_path / "cut.xml"
    p.write_text(xml[:cut], encoding="utf-8")
    docs, rep = read_wikixml(p)
    assert [d.title for d in docs] == ["Alpha", "Beta test"]
    assert rep.n_bad == 1 and "malformed" in rep.bad[0].reason


def test_empty_lead_is_counted(tmp_path: Path) -> None:
    p = tmp_path / "x.xml"
    p.write_text(_export([_page("Headfirst", 7, "{{Compact ToC}}\n==A==\n* [[Aa]]\n"), PAGES[2]]), encoding="utf-8")
    docs, rep = read_wikixml(p, text_mode="lead")
    assert [d.title for d in docs] == ["Delta"]
    assert rep.n_bad == 1 and rep.bad[0].record == "7" and "no text" in rep.bad[0].reason


@pytest.fixture(scope="module")
def sample_full() -> tuple[list[Document], object]:
    return read_wikixml(SAMPLE, text_mode="full")


def test_sample_counts(sample_full) -> None:
    docs, rep = sample_full
    assert rep.n_ok == 106 and rep.n_bad == 0
    assert rep.stats["n_pages"] == 205  # 106 articles + 99 main-namespace redirects (the 100th is in ns 4)
    assert rep.stats["n_redirects"] == 99
    assert 20_000 < rep.stats["n_links"] < 26_000
    titles = {d.title for d in docs}
    edges = {(d.title, t) for d in docs for t in d.links if t in titles}
    assert len(edges) == rep.stats["n_links_in_corpus"] == 87  # the data README's article-to-article edges
    assert ("Ayn Rand", "Aristotle") in edges and ("Anarchism", "Agriculture") in edges
    assert len({d.doc_id for d in docs}) == 106
    assert rep.stats["median_words"] > 2000
    for d in docs:  # markup is gone
        for bad in ("{{", "}}", "[[", "]]", "<ref", "{|", "thumb|", "''"):
            assert bad not in d.text, (d.title, bad)
        assert d.title not in d.links


def test_sample_lead() -> None:
    docs, rep = read_wikixml(SAMPLE, text_mode="lead")
    assert rep.n_ok == 105 and rep.n_bad == 1  # 'List of anthropologists' has no lead prose
    assert "List of anthropologists" in rep.bad[0].reason
    assert 100 < rep.stats["median_words"] < 400
    by = {d.title: d for d in docs}
    assert by["Anarchism"].text.startswith("Anarchism is a political philosophy")
    assert "History" not in by["Anarchism"].text.splitlines()
    assert 0 < rep.stats["n_links_in_corpus"] < 87


def test_wiki_export_is_streamed_from_s3(tmp_path: Path) -> None:
    """Issue 9: ``--source s3://bucket/dump.xml.bz2`` (README, cluster/aws.yaml, the RayJob) failed
    because the reader tested ``Path.exists()``; the export is now streamed from S3 and parsed exactly
    as the local file, and a missing object is named in the error."""
    import boto3

    from tests.s3server import moto_s3

    with moto_s3("dumps") as endpoint:
        boto3.client("s3", endpoint_url=endpoint).upload_file(str(SAMPLE), "dumps", f"enwiki/{SAMPLE.name}")
        uri = f"s3://dumps/enwiki/{SAMPLE.name}"
        docs, rep = read_wikixml(uri, text_mode="lead")
        want, want_rep = read_wikixml(SAMPLE, text_mode="lead")
        assert docs == want and len(docs) == want_rep.n_ok > 100
        assert rep.source == uri and rep.n_bad == want_rep.n_bad
        assert [p.title for p in iter_pages(uri)] == [p.title for p in iter_pages(SAMPLE)]
        via_dispatch, _ = read_documents(uri, text_mode="lead")
        assert via_dispatch == want
        with pytest.raises(FileNotFoundError, match="s3://dumps/enwiki/nope.xml.bz2"):
            list(iter_pages("s3://dumps/enwiki/nope.xml.bz2"))
