"""gcp-storage-emulator as a process of its own (`python tests/gcs_emulator.py PORT`, in memory, bucket `flywheel`)
for the tests of a gs:// `storage.uri` (tests/conftest.py gcs_bucket). Not a thread of the test: pyarrow holds the
GIL through some of its GCS requests (opening a Parquet file), and a server in the same process then never answers.

One gap of the emulator is filled: it ignores objects.list's includeTrailingDelimiter, which pyarrow sends with
every one-level listing and which GCS answers with the "dir/" marker objects among the items (pyarrow lists a
directory's subdirectories from those, not from `prefixes`); without it every directory looked empty."""

import logging
import sys

from gcp_storage_emulator.server import create_server
from gcp_storage_emulator.storage import Storage

_listed = Storage._apply_list_delimiter


def _with_trailing_delimiter(self, candidates, prefix, delimiter, match_glob):
    objs, prefixes = _listed(self, candidates, prefix, delimiter, match_glob)
    n = len(prefix or "")
    objs += [o for name, o in candidates if name[n:].endswith(delimiter) and name[n:].count(delimiter) == 1]
    return objs, prefixes


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)  # the emulator logs every request at INFO
    Storage._apply_list_delimiter = _with_trailing_delimiter
    create_server("127.0.0.1", int(sys.argv[1]), in_memory=True, default_bucket="flywheel").run()
