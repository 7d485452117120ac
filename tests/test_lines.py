"""Line framing: chunks split anywhere still give each line once, decoded leniently."""

from __future__ import annotations

import random

from clusterrun.logs.lines import LineFramer


def feed_all(chunks: list[bytes]) -> list[str]:
    framer = LineFramer()
    lines = [text for chunk in chunks for text in framer.feed(chunk)]
    tail = framer.close()
    return lines + ([tail] if tail is not None else [])


def test_lines_split_at_every_possible_byte_come_out_whole() -> None:
    data = "first line\nsecond: λ→✓ 😀\n\nlast without newline".encode()
    expected = ["first line", "second: λ→✓ 😀", "", "last without newline"]
    for cut in range(len(data) + 1):
        assert feed_all([data[:cut], data[cut:]]) == expected


def test_random_chunking_never_changes_the_lines() -> None:
    rng = random.Random(7)
    lines = ["".join(rng.choice("ab λ→😀\t") for _ in range(rng.randrange(0, 300)))
             for _ in range(200)]
    data = "\n".join(lines).encode() + b"\n"
    for _ in range(20):
        chunks, pos = [], 0
        while pos < len(data):
            step = rng.randrange(1, 64)
            chunks.append(data[pos:pos + step])
            pos += step
        assert feed_all(chunks) == lines


def test_progress_bar_redraws_show_their_final_state() -> None:
    assert feed_all([b"\r 10%", b"\r 50%", b"\r100%\n", b"next\n"]) == ["100%", "next"]
    assert feed_all([b"abc\r", b"\n"]) == ["abc"]  # \r\n split across chunks
    assert feed_all([b"a\r\nb\r\n"]) == ["a", "b"]


def test_flush_emits_a_partial_line_once() -> None:
    framer = LineFramer()
    assert framer.feed(b"prompt> ") == []
    assert framer.flush() == "prompt> "
    assert framer.flush() is None
    assert framer.feed(b"answer\n") == ["answer"]
    assert framer.feed(b"tail") == [] and framer.flush() == "tail"
    assert framer.feed(b"\n") == []  # the newline ending a flushed line adds no empty line


def test_flush_keeps_a_split_character_for_later() -> None:
    framer = LineFramer()
    word = "λ→".encode()
    framer.feed(word[:3])  # λ and the first byte of →
    assert framer.flush() == "λ"
    assert framer.feed(word[3:] + b"\n") == ["→"]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert feed_all([b"ok \xff\xfe bad\n", b"\xc3\n"]) == ["ok \ufffd\ufffd bad", "\ufffd"]


def test_huge_lines_pass_whole_and_endless_ones_are_cut() -> None:
    big = b"z" * 500_000
    assert feed_all([big[:1000], big[1000:], b"\n"]) == ["z" * 500_000]
    framer = LineFramer(max_line=1000)
    pieces = framer.feed(b"y" * 2500)
    assert pieces == ["y" * 1000, "y" * 1000]
    assert framer.close() == "y" * 500
