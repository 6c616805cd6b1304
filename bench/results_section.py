"""Replaces one marked section of bench/RESULTS.md, leaving the others alone.

    write_section(path, "cluster", text)   # text between <!-- cluster:begin --> and <!-- cluster:end -->

The section is appended when the file has none yet; the file is replaced
atomically (a reader sees the old or the new results, never a mix).
"""
import os
import re


def write_section(path, name, body):
    begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    section = begin + "\n" + body.strip("\n") + "\n" + end + "\n"
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n\n"
    m = re.search(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", old, re.S)
    new = old[:m.start()] + section + old[m.end():] if m else old.rstrip("\n") + "\n\n" + section
    tmp = path + "." + name + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, path)
    return section
