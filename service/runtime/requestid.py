"""Request ids: what the app gives a request that brings no sane one, and gunicorn's own error answers."""

import random


def fresh_id() -> str:
    """32 random hex digits. Unique, not secret: Python's generator (reseeded in every forked worker), not
    os.urandom's system call per request."""
    return f"{random.getrandbits(128):032x}"
