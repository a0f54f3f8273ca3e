"""A small terminal for tests: what a screen shows after a program's output with the control
sequences a live progress bar uses (carriage return, erase line, cursor up)."""

import re

_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def screen(text: str) -> list[str]:
    """The lines a terminal shows after ``text`` (no wrapping; colours and other control
    sequences are ignored)."""
    rows: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(text):
        m = _CSI.match(text, i)
        if m:
            arg, cmd = m.groups()
            if cmd == "K":  # erase the line (rich erases whole lines: 2K)
                rows[row] = [] if arg == "2" else rows[row][:col]
            elif cmd == "A":  # cursor up
                row = max(0, row - int(arg or 1))
            i = m.end()
            continue
        ch = text[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
            if row == len(rows):
                rows.append([])
        else:
            line = rows[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
    out = ["".join(r).rstrip() for r in rows]
    while out and not out[-1]:
        out.pop()
    return out
