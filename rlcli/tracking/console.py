"""What a job shows on the console, and what goes to its log file (`train.log` for `rlcli train`).

`job_log(path)` keeps, for the life of a job: every line the console shows (rlcli's lines,
its warnings and errors, the final state of the progress bar) copied into the log file; and
the libraries' own chatter (Python warnings, the log records of vLLM, transformers, torch,
datasets and the like) sent to the log file only, so that rlcli's first line is the first line
a user sees. Nothing is dropped: the log holds both.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

# Loggers of the libraries rlcli drives: their records go to the log file, not the console.
LIBRARY_LOGGERS = ("py.warnings", "vllm", "transformers", "torch", "datasets", "huggingface_hub",
                   "filelock", "urllib3", "httpx", "numexpr", "wandb", "mlflow",
                   "alembic", "bm25s")  # fmt: skip


class Tee:
    """A text stream that writes to `stream` and copies each finished line to `log`.

    A progress bar redraws its line with carriage returns: only what stands after the last
    one when the line ends is copied, so the log gets the bar's final state, not every frame.
    """

    def __init__(self, stream, log):
        self.stream, self.log, self.pending = stream, log, ""

    def write(self, text: str) -> int:
        try:
            self.stream.write(text)
        except ValueError:  # the console stream closed (a test's capture): nothing to show
            pass
        if self.log is None:  # the job is over; a handler made during it may still write here
            return len(text)
        self.pending += text
        if "\n" in self.pending:
            *lines, self.pending = self.pending.split("\n")
            self.log.write("".join(line.rsplit("\r", 1)[-1] + "\n" for line in lines))
            self.log.flush()
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except ValueError:  # closed, as above
            pass

    def __getattr__(self, name):  # isatty, fileno, encoding...: the console's
        return getattr(self.stream, name)


@contextmanager
def job_log(path: Path):
    """Copy the console into `path` and send the libraries' log records and warnings there only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.open("a", encoding="utf-8")
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    saved = {name: _route(logging.getLogger(name), handler) for name in LIBRARY_LOGGERS}
    # Hydra's own handler on this file would write rlcli's log records a second time: the
    # console copy already holds them.
    root = logging.getLogger()
    doubles = [h for h in root.handlers if getattr(h, "baseFilename", None) == str(path.resolve())]
    for double in doubles:
        root.removeHandler(double)
    logging.captureWarnings(True)
    out, err = sys.stdout, sys.stderr
    tees = Tee(out, log), Tee(err, log)
    sys.stdout, sys.stderr = tees
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
        for tee in tees:
            tee.log = None
        logging.captureWarnings(False)
        for double in doubles:
            root.addHandler(double)
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
        log.close()


class JobLogOnly(list):
    """A library logger's handlers while a job runs: the job log's, and no other. A library
    that adds its own console handler when it is first imported would otherwise print its
    records on the console mid-job: `datasets` does (rlcli imports it only once a job reads a
    data file), and then a damaged file's error reached the console before rlcli's message."""

    def append(self, handler: logging.Handler) -> None:  # what Logger.addHandler calls
        pass


def _route(logger: logging.Logger, handler: logging.Handler) -> tuple[list, bool]:
    """Send `logger`'s records to `handler` alone (at the levels they already have: raising
    them would wake torch's own per-module handlers); returns what to restore."""
    before = (logger.handlers[:], logger.propagate)
    logger.handlers, logger.propagate = JobLogOnly([handler]), False
    return before


def quiet_libraries() -> None:
    """Before any library is imported: vLLM and MLflow configure their own console loggers
    unless told not to (their records then reach `job_log`'s handler like any library's); C++
    warnings of torch and vLLM's CPU kernels (a NUMA binding notice on every CPU run) are
    written by C++ straight to the terminal, past Python, so only their level can keep them off
    it: errors only."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
