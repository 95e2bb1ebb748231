#!/usr/bin/env python3
"""The dependency-barrier waits of a SASS listing (docs/performance-log.md, v8).

Usage: cuobjdump -sass kernel.cubin > k.sass; dev/scripts/sass_waits.py k.sass [FIRST_LINE LAST_LINE]

Prints one line per instruction: the listing's line, the address, the instruction, its stall count,
the scoreboard it sets for its result (wb) or for reading its operands (rb), and, for every barrier
it waits on, the last instruction before it that set that barrier (in listing order, so across
branches only a hint). Volta and later encode these control bits in the high word of each 128-bit
instruction, which cuobjdump prints on the line after the instruction: bits 41-44 of that word are
the stall count, 46-48 the write barrier, 49-51 the read barrier, 52-57 the wait mask.
A wait on the barrier of a load that is not needed yet (a table row before the row loads, the next
item's position) is a memory round trip on the path.
"""
import re
import sys


def main(argv):
    lines = open(argv[1]).read().split("\n")
    lo, hi = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (0, len(lines))
    set_by = {}
    i = 0
    while i < len(lines) - 1:
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*/\* (0x[0-9a-f]{16}) \*/", lines[i])
        m2 = re.match(r"\s+/\* (0x[0-9a-f]{16}) \*/", lines[i + 1]) if m else None
        if not (m and m2):
            i += 1
            continue
        ctl = int(m2.group(1), 16) >> 41
        stall, wb, rb, waits = ctl & 15, (ctl >> 5) & 7, (ctl >> 8) & 7, (ctl >> 11) & 63
        text = m.group(2)
        if lo <= i + 1 <= hi:
            waited = [b for b in range(6) if waits >> b & 1]
            note = " ".join(f"WAIT {b}({set_by.get(b, '?')[:48]})" for b in waited)
            marks = (f" wb={wb}" if wb != 7 else "") + (f" rb={rb}" if rb != 7 else "")
            print(f"{i + 1} {m.group(1)} {text[:72]} st={stall}{marks} {note}".rstrip())
        if wb != 7:
            set_by[wb] = text
        if rb != 7:
            set_by[rb] = "rd:" + text
        i += 2


if __name__ == "__main__":
    main(sys.argv)
