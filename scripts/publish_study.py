#!/usr/bin/env python3
"""Publishes a study run: copies its report, CSV files and plots from the
output directory into doc/study/, and the report's verdict table into the
README (between its study markers), so that what the README says of the
study is what the study wrote. tests/check_docs.py checks the two match.

    scripts/publish_study.py [OUT]    # OUT: the study's --out, default out/study
"""
import glob
import os
import re
import shutil
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BEGIN = "<!-- study verdicts: begin -->"
END = "<!-- study verdicts: end -->"


def verdict_table(results_md):
    """The first Markdown table of results.md: the claim | verdict table the study writes first."""
    lines, table = results_md.splitlines(), []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if not table or not table[0].replace(" ", "").startswith("|claim|verdict|"):
        raise SystemExit("publish_study: results.md does not open with a 'claim | verdict' table")
    return "\n".join(table)


def readme_with(readme, table):
    """The README with the text between its study markers replaced by table."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        raise SystemExit(f"publish_study: README.md has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", readme)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "out", "study")
    results = os.path.join(out, "results.md")
    if not os.path.exists(results):
        raise SystemExit(f"publish_study: {results} is missing: run scripts/main.sh first")
    dest = os.path.join(ROOT, "doc", "study")
    os.makedirs(dest, exist_ok=True)
    files = [results] + sorted(glob.glob(os.path.join(out, "*.csv")) + glob.glob(os.path.join(out, "*.png")))
    for f in files:
        shutil.copy(f, dest)
    readme_path = os.path.join(ROOT, "README.md")
    with open(readme_path, encoding="utf-8") as f:
        readme = f.read()
    with open(results, encoding="utf-8") as f:
        table = verdict_table(f.read())
    with open(readme_path, "w", encoding="utf-8") as f:
        f.write(readme_with(readme, table))
    print(f"publish_study: {len(files)} files into doc/study/, the verdict table into README.md")


if __name__ == "__main__":
    main()
