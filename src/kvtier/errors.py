"""Typed errors shared by every room. Each message says what to do about it."""


class KvtierError(Exception):
    """Base of every error kvtier raises on purpose."""


class SpecError(KvtierError, ValueError):
    """A model, hardware or profile specification is unknown, malformed or impossible."""


class ConfigError(KvtierError, ValueError):
    """A configuration value (URL, size, option) is malformed or out of range."""


class MissingExtraError(KvtierError, ImportError):
    """A backend needs an optional dependency that is not installed.

    ``install`` says how to get it where a ``kvtier[extra]`` does not (vLLM's CPU build).
    """

    def __init__(self, what: str, extra: str, module: str, install: str | None = None):
        how = install or f"`pip install 'kvtier[{extra}]'`"
        super().__init__(f"{what} needs the Python package '{module}'; install it with {how}")
        self.extra = extra
        self.module = module


class TierPathError(ConfigError):
    """A directory (or file) given for a tier or an output cannot be used; the message names the
    path, says why and what to do. ``reason`` is a short tag: ``nul``, ``empty``, ``too-long``,
    ``not-a-directory``, ``is-a-directory``, ``missing``, ``pseudo-fs``, ``read-only``,
    ``permission``, ``no-space`` or ``os-error``.
    """

    def __init__(self, message: str, path: str = "", reason: str = "os-error"):
        super().__init__(message)
        self.path = path
        self.reason = reason

    def __reduce__(self):
        return (type(self), (str(self), self.path, self.reason))


class TierUnavailableError(KvtierError):
    """A tier's server cannot be used at open: not answering, wrong credentials, no such bucket.

    The message names the tier (never its credentials) and what to do.
    """
