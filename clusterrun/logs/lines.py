"""Turning one source's byte stream into display lines.

The bytes arrive in arbitrary chunks: a line may be split anywhere, even inside a multi-byte
character; progress bars redraw with ``\\r``; some output is not UTF-8 at all. Each complete line
comes out once, decoded leniently, so one prefix per line is always possible.
"""

from __future__ import annotations

from typing import Optional

# A line longer than this is cut into pieces so memory stays bounded.
MAX_LINE = 4 * 1024 * 1024


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _utf8_cut(raw: bytes) -> int:
    """Where to cut ``raw`` so no multi-byte character is split: the length of its complete
    prefix (at most 3 trailing bytes are held back)."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte & 0x80 == 0:
            return len(raw)
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return len(raw) if back >= need else len(raw) - back
    return len(raw)


class LineFramer:
    """Feed chunks in, get complete lines out.

    ``\\n`` ends a line. ``\\r`` (a progress bar redrawing) ends nothing: only the text after the
    last ``\\r`` is kept, as a terminal would show it, and comes out when the line ends or when
    the caller flushes a partial line (after a quiet second, say, or at end of stream).
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._current = bytearray()  # the segment being written
        self._shown: Optional[bytes] = None  # the last segment a `\r` closed
        self._flushed = False  # part of this line already went out through flush()

    def blocks(self, data: bytes) -> list[str]:
        """Like ``feed``, but runs of complete lines come out joined by ``\\n`` as one string,
        so a caller can label a whole chunk at once: a fast log stream is hundreds of
        thousands of lines a second, too many to handle one by one in Python. The lines are
        exactly those ``feed`` would give, in the same order."""
        out: list[str] = []
        if self.pending or self._flushed:
            nl = data.find(b"\n")
            if nl < 0:
                return self.feed(data)
            out.extend(self.feed(data[: nl + 1]))
            data = data[nl + 1 :]
        last = data.rfind(b"\n")
        # A `\r` needs the per-segment rules, and a line past max_line must be cut: both are
        # rare, so they take the line-by-line way.
        if last < 0 or last >= self.max_line or b"\r" in data:
            out.extend(self.feed(data))
            return out
        # UTF-8 never uses the byte 0x0A inside a character, so decoding the run at once
        # replaces exactly what decoding each line would.
        out.append(decode(data[:last]))
        self.feed(data[last + 1 :])
        return out

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            piece = data[start:] if nl < 0 else data[start:nl]
            self._absorb(piece, lines)
            if nl < 0:
                return lines
            visible = self._visible()
            if visible or not self._flushed:
                lines.append(decode(visible))
            self._current.clear()
            self._shown = None
            self._flushed = False
            start = nl + 1

    def _absorb(self, piece: bytes, lines: list[str]) -> None:
        segments = piece.split(b"\r")
        for seg in segments[:-1]:
            self._current += seg
            if self._current:
                self._shown = bytes(self._current)
            self._current.clear()
        self._current += segments[-1]
        while len(self._current) > self.max_line:
            cut = _utf8_cut(bytes(self._current[: self.max_line])) or self.max_line
            lines.append(decode(bytes(self._current[:cut])))
            del self._current[:cut]
            self._shown = None

    def _visible(self) -> bytes:
        if self._current:
            return bytes(self._current)
        return self._shown or b""

    @property
    def pending(self) -> bool:
        return bool(self._current) or self._shown is not None

    def flush(self) -> Optional[str]:
        """The partial line so far (None if there is none), as if it had ended. A character
        split at the end is held back for the next chunk."""
        if not self.pending:
            return None
        if self._current:
            cut = _utf8_cut(bytes(self._current))
            if cut == 0:
                return None
            text = decode(bytes(self._current[:cut]))
            del self._current[:cut]
            self._flushed = True
        else:
            text = decode(self._shown or b"")
        self._shown = None
        self._flushed = True
        return text

    def close(self) -> Optional[str]:
        """End of stream: whatever is left, even an incomplete character."""
        text = self.flush()
        if self._current:
            rest = decode(bytes(self._current))
            self._current.clear()
            text = (text or "") + rest
        return text
