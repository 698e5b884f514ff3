from textkit import slugify, truncate, word_count


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_custom_separator():
    assert slugify("Polar  bears swim", sep="_") == "polar_bears_swim"


def test_word_count():
    assert word_count("  one two\tthree\n") == 3


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"
