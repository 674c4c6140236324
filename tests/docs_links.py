# SPDX-License-Identifier: MIT
"""Documentation links: fails when a source, test or documentation file

* still cites a numbered section of a format note that is not in this
  repository ("spec 2.2", "megatron-format.md 3.5", "target-formats.md",
  "shared/specs/..."), or
* cites docs/<page>.md#<anchor> (from anywhere in the tree) or links
  <page>.md#<anchor> (from a markdown file) whose file does not exist or
  whose anchor is not the GitHub slug of one of the page's headings.

Run from anywhere: python3 tests/docs_links.py [REPO_ROOT].  Prints one line
per problem (file:line: what) and exits 1 if there is any.
"""
import os
import re
import subprocess
import sys

EXTS = ('.c', '.h', '.py', '.bats', '.md', '.cu', '.sh', '.cmake', '.txt',
        '.proto')
STALE = re.compile(r'\bspec [0-9]|\b(?:dcp|megatron|mindspore|paddle|target)'
                   r'-formats?\.md|shared/specs/')
# docs/<path>.md#anchor anywhere; a markdown link (<path>.md#anchor) too.
CITE = re.compile(r'(?<![\w/.-])(docs/[\w./-]+\.md)#([\w-]+)')
MDLINK = re.compile(r'\]\(([\w./-]*\.md)?#([\w-]+)\)')


def slug(heading):
    """GitHub's anchor for a heading text."""
    s = heading.strip().lower()
    s = re.sub(r'[^\w\- ]', '', s)
    return s.replace(' ', '-')


def anchors(path, cache={}):
    if path not in cache:
        seen, out, fence = {}, set(), False
        with open(path, encoding='utf-8') as f:
            for line in f:
                if line.startswith('```'):
                    fence = not fence
                    continue
                m = None if fence else re.match(r'#{1,6} (.*)', line)
                if not m:
                    continue
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                out.add(base if n == 0 else '%s-%d' % (base, n))
        cache[path] = out
    return cache[path]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), '..')
    os.chdir(root)
    files = subprocess.check_output(['git', 'ls-files']).decode().split('\n')
    files = [f for f in files if f.endswith(EXTS) and os.path.isfile(f)]
    bad = []
    for f in files:
        try:
            lines = open(f, encoding='utf-8').read().split('\n')
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(lines, 1):
            m = STALE.search(line)
            if m and f != 'tests/docs_links.py':
                bad.append('%s:%d: cites "%s": cite docs/formats/<page>.md#'
                           '<anchor> instead' % (f, i, m.group(0)))
            refs = [(p, a) for p, a in CITE.findall(line)]
            if f.endswith('.md'):
                for p, a in MDLINK.findall(line):
                    target = os.path.normpath(
                        os.path.join(os.path.dirname(f), p)) if p else f
                    refs.append((target, a))
            for p, a in refs:
                if f == 'tests/docs_links.py':
                    continue
                if not os.path.isfile(p):
                    bad.append('%s:%d: %s: no such file' % (f, i, p))
                elif a not in anchors(p):
                    bad.append('%s:%d: %s has no heading with anchor #%s'
                               % (f, i, p, a))
    for b in bad:
        print(b)
    print('docs_links: %d files, %d problems' % (len(files), len(bad)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
