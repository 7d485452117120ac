"""Line framing: chunks split anywhere still give each line once, decoded leniently."""

from __future__ import annotations

import io
import random
import re

from clusterrun.console import Printer
from clusterrun.logs.lines import LineFramer
from clusterrun.logs.view import Filter, LogView


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


def _split(data: bytes, rng: random.Random, most: int) -> list[bytes]:
    chunks, pos = [], 0
    while pos < len(data):
        step = rng.randrange(1, most)
        chunks.append(data[pos:pos + step])
        pos += step
    return chunks


def test_blocks_give_exactly_the_lines_feed_gives() -> None:
    """The chunk-at-once path: the same lines, in the same order, for any chunking, with
    progress bars, invalid UTF-8, split characters, flushed partial lines and cut lines."""
    rng = random.Random(11)
    alphabet = [b"a", b"b", b" ", "λ".encode(), "😀".encode(), b"\xff", b"\r", b"\n", b"\n"]
    data = b"".join(rng.choice(alphabet) for _ in range(6_000))
    for max_line in (4 * 1024 * 1024, 50):
        for most in (3, 40, 5000):
            for _ in range(3):
                chunks = _split(data, rng, most)
                flush_at = {i for i in range(len(chunks)) if rng.random() < 0.1}
                by_line, by_block = LineFramer(max_line), LineFramer(max_line)
                want: list[str] = []
                got: list[str] = []
                for i, chunk in enumerate(chunks):
                    want.extend(by_line.feed(chunk))
                    for block in by_block.blocks(chunk):
                        got.extend(block.split("\n"))
                    if i in flush_at:
                        want.append(str(by_line.flush()))
                        got.append(str(by_block.flush()))
                want.append(str(by_line.close()))
                got.append(str(by_block.close()))
                assert got == want


def test_a_chunk_of_whole_lines_comes_out_as_one_block() -> None:
    framer = LineFramer()
    assert framer.blocks(b"one\ntwo\nthr") == ["one\ntwo"]
    assert framer.blocks(b"ee\nfour\nfive\n") == ["three", "four\nfive"]
    assert framer.blocks(b"") == [] and not framer.pending


def test_the_view_prefixes_every_line_of_a_block_and_greps_each() -> None:
    out = io.StringIO()
    view = LogView(Printer(out, color=False))
    view.feed("gpu-a", "rank-3.log", b"loss 1\nloss 2\npart")
    view.feed("gpu-b", "node.log", b"started\n")
    view.close()
    assert out.getvalue() == ("[gpu-a r3] loss 1\n[gpu-a r3] loss 2\n[gpu-b] started\n"
                              "[gpu-a r3] part\n")
    out = io.StringIO()
    view = LogView(Printer(out, color=False), Filter(grep=re.compile("2|7")))
    view.feed("gpu-a", "rank-0.log", b"loss 1\nloss 2\nloss 3\nloss 7\n")
    assert out.getvalue() == "[gpu-a r0] loss 2\n[gpu-a r0] loss 7\n"
