"""The training text: the licence texts Debian's `base-files` package ships in
/usr/share/common-licenses (every regular file, sorted by name; symlinks skipped)."""

import os

CORPUS_DIR = "/usr/share/common-licenses"
CORPUS_PACKAGE = "base-files"
# The tiny model trains on these (a few CPU minutes memorise them well, which gives the golden
# prompts real margins); the tokenizer trains on every file.
MODEL_TRAIN_FILES = ["Apache-2.0", "Artistic", "BSD", "GPL-3", "LGPL-3"]


def corpus_files():
    names = sorted(n for n in os.listdir(CORPUS_DIR) if not os.path.islink(os.path.join(CORPUS_DIR, n)))
    return [os.path.join(CORPUS_DIR, n) for n in names if os.path.isfile(os.path.join(CORPUS_DIR, n))]


def corpus_documents(names=None):
    """[(name, text)] for every licence file, or for the given file names."""
    docs = []
    for path in corpus_files():
        if names is not None and os.path.basename(path) not in names:
            continue
        with open(path, encoding="utf-8") as f:
            docs.append((os.path.basename(path), f.read()))
    return docs
