"""What each dual-perspective strategy must run (Zhao et al., 2024, Section 3): the tests' own oracle."""

EXPECTED_STAGES = {
    "R&B": ["generator"], "R&L": ["generator"], "Ext": ["extractor", "generator"],
    "Fil": ["filter", "generator"], "E&F": ["extractor", "filter", "generator"],
}  # fmt: skip
