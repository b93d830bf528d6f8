#!/usr/bin/env python3
"""Checks on the README and the guides in doc/ (the meson test doc_links):

- every relative link and image resolves to a file, and every #anchor to a
  heading of the page it names (GitHub's rule for heading anchors);
- the README opens with its two commands and stays short;
- the figures of the README's results table equal those of the generated
  file each row cites: the throughput row against doc/bench/compare.md's
  float32, 1-thread ratios;
- the README's study verdicts are doc/study/results.md's verdict table, line
  for line (scripts/publish_study.py copies it).

    check_docs.py SOURCE_ROOT
"""
import os
import re
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
errors = []


def fail(msg):
    errors.append(msg)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", open(path, encoding="utf-8").read())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def check_links(root, path):
    text = FENCE.sub("", open(path, encoding="utf-8").read())
    rel = os.path.relpath(path, root)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            fail(f"{rel}: link {target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            fail(f"{rel}: link {target}: no heading with that anchor in {os.path.relpath(dest, root)}")


def table_rows(text):
    """Every Markdown table of text as a list of dicts (header -> cell)."""
    tables, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            tables.append([])
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
            tables[-1].append(dict(zip(header, cells)))
    return [row for table in tables for row in table]


def check_readme(root):
    path = os.path.join(root, "README.md")
    text = open(path, encoding="utf-8").read()
    lines = text.splitlines()
    if len(lines) > 200:
        fail(f"README.md: {len(lines)} lines; it is the first screen, the guides in doc/ hold the rest")
    first_block = re.search(r"^```sh\n(.*?)^```", text, re.S | re.M)
    commands = [l.split("#")[0].strip() for l in first_block.group(1).splitlines()] if first_block else []
    if commands != ["scripts/main.sh", "scripts/test.sh"]:
        fail(f"README.md: the first shell block must be the two commands, not {commands}")

    rows = [r for r in table_rows(text) if "training throughput against PyTorch" in r.get("what", "")]
    if len(rows) != 1:
        fail("README.md: no results row 'training throughput against PyTorch ...'")
        return
    row = rows[0]
    cited = LINK.search(row.get("source", ""))
    if not cited:
        fail("README.md: the throughput row cites no file")
        return
    source = os.path.normpath(os.path.join(root, cited.group(1)))
    quoted = re.findall(r"([\w-]+) (\d+\.\d+)×", row["result"])
    if not quoted:
        fail("README.md: the throughput row quotes no ratio")
    generated = table_rows(open(source, encoding="utf-8").read())
    for workload, ratio in quoted:
        found = [r["ratio"] for r in generated if r.get("workload") == workload and r.get("threads") == "1"
                 and r.get("dtype", "f32") == "f32" and "ratio" in r]
        if found != [ratio + "×"]:
            fail(f"README.md: {workload} {ratio}× at 1 thread, float32; {cited.group(1)} says {found}")


def check_study_table(root):
    sys.path.insert(0, os.path.join(root, "scripts"))
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    from publish_study import BEGIN, END, verdict_table
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    block = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), readme, re.S)
    if not block:
        fail(f"README.md: no study verdicts between {BEGIN} and {END}")
        return
    try:
        generated = verdict_table(open(os.path.join(root, "doc", "study", "results.md"), encoding="utf-8").read())
    except SystemExit as e:
        fail(f"doc/study/results.md: {e}")
        return
    if block.group(1) != generated:
        fail("README.md: the study verdicts differ from doc/study/results.md's table "
             "(scripts/publish_study.py copies it)")


def main():
    root = sys.argv[1]
    pages = [os.path.join(root, "README.md")]
    for d, _, files in os.walk(os.path.join(root, "doc")):
        pages += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
    for page in pages:
        check_links(root, page)
    check_readme(root)
    check_study_table(root)
    for e in errors:
        print(e)
    print(f"check_docs: {len(pages)} pages, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
