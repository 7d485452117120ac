"""Which environment variables are secrets, and how they are masked wherever clusterrun shows or
stores an environment.

A name is a secret when one of its ``_``-separated words (any case, a plural ``S`` or trailing
digits aside) is in ``WORDS``: ``DB_PASS``, ``GITHUB_PAT``, ``WANDB_API_KEY`` and ``HF_TOKEN2``
are; ``MONKEY``, ``KEYBOARD`` and ``TOKENIZERS_PARALLELISM`` are not. This is the one list:
docs/security.md and the footer of ``launch --dry-run`` (``describe()``) show it.
"""

from __future__ import annotations

WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "PGPASSWORD", "PAT",
         "KEY", "APIKEY", "CREDENTIAL", "CREDS", "AUTH", "PRIVATE", "COOKIE")
MASK = "******"

_WORDS = frozenset(WORDS)


def _matches(word: str) -> bool:
    word = word.upper().rstrip("0123456789")
    return word in _WORDS or (word.endswith("S") and word[:-1] in _WORDS)


def is_secret(name: str) -> bool:
    return any(_matches(word) for word in name.split("_"))


def masked(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def describe() -> str:
    """The rule in one sentence, for people: the docs and `--dry-run` print this."""
    return (f"Secrets are variables with one of the words {', '.join(WORDS)} in their name "
            "(words are separated by '_'; any case, plural or numbered: DB_PASS, WANDB_API_KEY, "
            "HF_TOKEN2; not MONKEY or KEYBOARD).")
