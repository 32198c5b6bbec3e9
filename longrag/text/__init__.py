"""Text utilities shared by every stage: sentence spans and token counting."""
