"""What every Python model's `finalize()` does last, so that Triton's stub process ends without a crash. Imported
only inside Triton's Python backend."""

from __future__ import annotations

import gc


def release(model: object) -> None:
    """Drops what `model` holds and collects every reference cycle while the stub's shared memory is still mapped.

    Triton 2.51's stub unmaps its shared memory (Stub::~Stub) before the interpreter's finalization, whose last
    collection frees the cycles still left. A pb_utils object among them frees its shared memory there, locking a
    mutex in memory that is gone, and the stub dies of a segfault in pthread_mutex_lock ("triton_python_b[...]:
    segfault ... in libc.so.6" in the kernel log). Such cycles are common: an exception's traceback holds its frames,
    and with them the request an `execute()` frame was serving (jinja2 rewrites a failing chat template's traceback
    into a cycle), and a model object that a thread of its own refers to is itself in one. Call it after every
    thread of the model has ended. What `gc.freeze()` put aside is collected as well.
    """
    vars(model).clear()
    gc.unfreeze()
    gc.collect()
