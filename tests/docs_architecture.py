# SPDX-License-Identifier: MIT
"""docs/architecture.md against the tree: fails when a repository path it
names (`fs/tree.c`, `resolver/dcp/`, `fs/fuse_*.c`) does not exist, when a
bare file name it gives (`bcache.c`) is no file of the tree (nor a
system header), or when a
function-like name (`flx_fs_pieces()`, `probe(dirfd)`) is neither defined nor
declared in the C sources (a definition, a prototype, a function-pointer
member or a function-like macro).  Names that are no flx_ name and that the
sources call (libc, libfuse, libzstd: `fuse_reply_data()`, `dlopen()`) are
taken as external and accepted.

Run: python3 tests/docs_architecture.py [REPO_ROOT].  One line per problem,
exit 1 if there is any.
"""
import glob
import os
import re
import subprocess
import sys

TOP = ('resolver', 'reshard', 'fs', 'gpu', 'mountopts', 'tools', 'tests',
       'docs', 'examples')
PATH = re.compile(r'(?<![\w./-])((?:%s)/[\w./*<>-]*)' % '|'.join(TOP))
BARE = re.compile(r'^[\w-]+\.(?:c|h|cu|proto)$')
CALL = re.compile(r'\b([A-Za-z_]\w*)\(([^()`]*)\)')
CODE_EXT = ('.c', '.h', '.cu')


def code_lines(files):
    """Every line of the C sources that is not inside a comment."""
    out = []
    for f in files:
        text = open(f, encoding='utf-8', errors='replace').read()
        text = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'),
                      text, flags=re.S)
        text = re.sub(r'//[^\n]*', '', text)
        out.extend(text.split('\n'))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), '..')
    os.chdir(root)
    tracked = subprocess.check_output(['git', 'ls-files']).decode().split()
    basenames = {os.path.basename(f) for f in tracked}
    lines = code_lines([f for f in tracked if f.endswith(CODE_EXT)])
    code = '\n'.join(lines)
    doc = open('docs/architecture.md', encoding='utf-8').read()
    bad = []

    paths = set(PATH.findall(doc))
    for p in sorted(paths):
        p = p.rstrip('.,:;')
        if '<' in p:  # a pattern such as resolver/<fmt>/<fmt>.c
            continue
        if '*' in p:
            if not glob.glob(p):
                bad.append('path %s: matches nothing' % p)
        elif not (os.path.exists(p) or os.path.exists(p + '.c')):
            bad.append('path %s: no such file or directory' % p)

    spans = re.findall(r'`([^`]+)`', doc)
    for s in spans:
        if BARE.match(s) and s not in basenames and not (
                glob.glob('/usr/include/' + s) or
                glob.glob('/usr/include/*/' + s)):  # a system header
            bad.append('file %s: no file of that name in the tree' % s)

    names = set()
    for s in spans:
        for name, _ in CALL.findall(s):
            names.add(name)
    for name in sorted(names):
        if name.isupper():  # an opcode or a constant, not a function
            continue
        n = re.escape(name)
        decl = re.compile(
            r'^(?!\s*(?:return|if|while|for|else|case|do)\b)\s*[A-Za-z_]'
            r'[\w\s\*]*?[\s\*]' + n + r'\s*\(|'
            r'\(\s*\*\s*' + n + r'\s*\)\s*\(|'
            r'#\s*define\s+' + n + r'\(', re.M)
        if decl.search(code):
            continue
        if not name.startswith('flx_') and re.search(r'\b' + n + r'\s*\(',
                                                      code):
            continue  # an external function the sources call
        bad.append('function %s(): defined or declared nowhere' % name)

    for b in bad:
        print('docs/architecture.md: ' + b)
    print('docs_architecture: %d paths, %d names, %d problems'
          % (len(paths), len(names), len(bad)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
