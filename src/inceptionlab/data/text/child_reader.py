"""IMDB reviews read and standardized in a child Python process, while the parent does other work.

Reading the aclImdb archive (tar headers, 50,000 members) and standardizing the reviews is ~3 s of
pure Python, so it holds the GIL. The `train` command meanwhile imports `torch._dynamo` (1.3-1.8 s,
also Python: every torch optimizer needs it), and in one process the two take turns on one core.
A child process runs them side by side on two cores. The child is a fresh interpreter
(`python -m inceptionlab.data.text.child_reader SOURCE`), not a multiprocessing spawn or fork: it imports
neither torch nor the caller's main module, and forking a process that holds torch's thread pools
is not safe. It writes the pickled result to stdout; a bad source exits with the UserError's code
and message. If the child cannot start or dies otherwise, the reading happens in this process.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import inceptionlab
from inceptionlab.data.datasets.imdb import acl_root, load_imdb_splits
from inceptionlab.data.text.standardize import StandardizedTexts, standardize_all
from inceptionlab.errors import UserError

StandardizedSplits = dict[str, tuple[StandardizedTexts, list[int]]]

# Below this the child's start-up (~0.2 s: an interpreter, tokenizers) costs more than it saves:
# the 2,000-review subset reads in 0.2 s. The full archive is 28 MB; its folder holds 12,500 files
# per class.
WORKER_MIN_ARCHIVE_BYTES = 4 * 2**20
WORKER_MIN_FILES_PER_CLASS = 2_000


def read_standardized(source: str | os.PathLike) -> StandardizedSplits:
    """{split: (standardized texts, labels)} for both splits, read in one pass (see `imdb.load_imdb_splits`)."""
    return {split: (standardize_all(texts), labels) for split, (texts, labels) in load_imdb_splits(source).items()}


def worth_a_worker(source: Path) -> bool:
    if source.is_file():
        return source.stat().st_size >= WORKER_MIN_ARCHIVE_BYTES
    positive = acl_root(source) / "train" / "pos"
    if not positive.is_dir():
        return False  # read here, where the missing folder gets its error message
    with os.scandir(positive) as entries:
        return sum(1 for _ in zip(range(WORKER_MIN_FILES_PER_CLASS), entries)) >= WORKER_MIN_FILES_PER_CLASS


def read_standardized_in_worker(source: str | os.PathLike) -> StandardizedSplits:
    """`read_standardized(source)` in a child process when the data is big enough to gain from it."""
    source = Path(source)
    if not worth_a_worker(source):
        return read_standardized(source)
    package_parent = str(Path(inceptionlab.__file__).resolve().parents[1])  # the child imports this very copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    try:
        child = subprocess.Popen([sys.executable, "-m", __name__, str(source)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError:
        return read_standardized(source)
    with child:
        try:
            out, err = child.communicate()  # waits without the GIL: the caller's threads run meanwhile
        except BaseException:  # Ctrl-C included: leave no child behind
            child.kill()
            raise
    if child.returncode == 0:
        return pickle.loads(out)
    if child.returncode == UserError.exit_code and err.strip():
        raise UserError(err.decode("utf-8", errors="replace").strip().splitlines()[-1])
    return read_standardized(source)  # the child died otherwise (memory, a signal): read here instead


def main(argv: list[str] | None = None) -> int:
    (source,) = argv if argv is not None else sys.argv[1:]
    try:
        result = read_standardized(source)
    except UserError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    sys.stdout.buffer.write(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
