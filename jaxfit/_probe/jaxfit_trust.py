"""Pins are code: only a pin this user's own jaxfit wrote is ever loaded.

A pin's ``executable.bin`` is a serialised XLA executable, and loading it
(``serialize_executable.deserialize_and_load``) unpickles it in the training process: whoever can
write a pin can run code there. So:

- **Private folders.** Pins are written into folders of the user's own, mode 0700
  (:func:`private_folder`: created so, or refused when they belong to another user or others can
  write them; never a shared fallback), their files mode 0600.
- **Signed.** Each ``pin.json`` carries an HMAC-SHA256 (:func:`sign`) over the executable's SHA-256
  and the pin's fields, made with a key of the user's own: 32 random bytes in
  ``<jaxfit cache>/pin-key`` (mode 0600, made on first use; ``$JAXFIT_PIN_KEY`` names another;
  pins outside the cache, ``--no-cache``'s, are signed with one in their private temporary folder).
  Whoever can replace the executable can replace ``pin.json``, but not make its signature without
  the key.
- **Checked before anything is unpickled.** The start-up hook refuses a pin whose folder or files
  another user owns or others can write, or whose signature does not match the user's key
  (:func:`problem`), and reads the executable's bytes once, checks them, and loads those bytes.

Standard library only, Python 3.9+: it runs in the script's environment too.
"""

import hashlib
import hmac
import json
import os
import stat
from typing import Any, Dict, Optional

KEY_ENV = "JAXFIT_PIN_KEY"
"""The key file, when it is not ``<jaxfit cache>/pin-key``."""
KEY_FILE = "pin-key"
SIGNATURE_FIELD = "signature"
UNSIGNED_FIELDS = (SIGNATURE_FIELD, "summary")
"""Fields of ``pin.json`` outside the signature: ``summary`` repeats the others for jaxfit, with the
pin's own path, which changes when a pin is moved or copied."""


class UntrustedPin(Exception):
    """A pin, a key or a folder that is not the user's own, or not private."""


def cache_root() -> str:
    """jaxfit's cache folder: ``$JAXFIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxfit`` or ``~/.cache/jaxfit``."""
    return os.environ.get("JAXFIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jaxfit"
    )


def temp_root() -> str:
    """The private folder of this user's pins outside the cache (``--no-cache``, or a cache folder
    that cannot hold them): ``$TMPDIR/jaxfit-pins-<uid>`` (``/tmp`` when ``TMPDIR`` is unset; an
    unwritable ``TMPDIR`` is an error, never a fallback to another folder)."""
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", "jaxfit-pins-%d" % os.getuid())


def key_paths() -> "list[str]":
    """Where this user's pin key may be, in order: ``$JAXFIT_PIN_KEY`` alone when set, else the
    cache folder's, then the temporary pins folder's (for a cache folder that cannot hold one)."""
    if os.environ.get(KEY_ENV):
        return [os.environ[KEY_ENV]]
    return [os.path.join(cache_root(), KEY_FILE), os.path.join(temp_root(), KEY_FILE)]


def default_key_path() -> str:
    """Where the key is in a shell that sets none of jaxfit's variables."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jaxfit", KEY_FILE)


def key_path() -> str:
    """Where this user's pin key is (the first of :func:`key_paths` that exists, else the first)."""
    paths = key_paths()
    return next((p for p in paths if os.path.lexists(p)), paths[0])


def _own(st: os.stat_result, what: str, path: str) -> None:
    uid = os.getuid()
    if st.st_uid != uid:
        raise UntrustedPin("%s %s belongs to user %d, not to you (%d)" % (what, path, st.st_uid, uid))


def private_folder(path: str) -> str:
    """``path`` as a private folder of this user's (made with mode 0700 when missing, parents
    included). An existing folder must be a real folder (no link) owned by this user that no one
    else can write (one only others can read is made 0700).

    Raises:
      UntrustedPin: it belongs to another user, others can write it, or it is a link or a file.
    """
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UntrustedPin("%s is not a folder (a link or a file stands there)" % path)
    _own(st, "the folder", path)
    if st.st_mode & 0o022:
        raise UntrustedPin(
            "the folder %s can be written by others (mode %o): a pin there could be replaced; remove it, or "
            "name a private folder" % (path, stat.S_IMODE(st.st_mode))
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def load_key(create: bool, in_cache: bool = True) -> bytes:
    """This user's pin key for signing. With ``create``: the first of :func:`key_paths` (the
    temporary pins folder's first when not ``in_cache``: ``--no-cache`` writes nothing to the cache)
    that exists or can be made in a private folder; without: the first that exists. Pins signed
    with any of them are accepted (:func:`verify`).

    Raises:
      UntrustedPin: no key (and none to be made), or one that is not this user's or others can read.
    """
    paths = key_paths() if in_cache else key_paths()[::-1]
    if not create:
        existing = [p for p in paths if os.path.lexists(p)]
        if existing:
            return _read_key(existing[0])
        raise UntrustedPin("no pin key at %s: your jaxfit signed no pin" % " or ".join(paths))
    failures = []
    for path in paths:
        if os.path.lexists(path):
            return _read_key(path)
        try:
            private_folder(os.path.dirname(os.path.abspath(path)))
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another jaxfit made it meanwhile
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(os.urandom(32))
            return _read_key(path)
        except (OSError, UntrustedPin) as e:
            failures.append("%s: %s" % (path, getattr(e, "strerror", None) or e))
    raise UntrustedPin("cannot make a pin key (%s)" % "; ".join(failures))


def _read_key(path: str) -> bytes:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UntrustedPin("no pin key at %s" % path) from None
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedPin("the pin key %s is not a file" % path)
    _own(st, "the pin key", path)
    if st.st_mode & 0o077:
        raise UntrustedPin("the pin key %s can be read by others (mode %o)" % (path, stat.S_IMODE(st.st_mode)))
    with open(path, "rb") as f:
        key = f.read()
    if len(key) < 16:
        raise UntrustedPin("the pin key %s is too short" % path)
    return key


def _message(pin: Dict[str, Any], executable_sha256: str) -> bytes:
    fields = {k: v for k, v in pin.items() if k not in UNSIGNED_FIELDS}
    return (executable_sha256 + "\n" + json.dumps(fields, sort_keys=True, default=str)).encode()


def sign(pin: Dict[str, Any], executable_sha256: str, in_cache: bool = True) -> str:
    """The signature of ``pin`` (its fields) and the executable of that SHA-256, with this user's key
    (:func:`load_key`, made when missing)."""
    return hmac.new(load_key(True, in_cache), _message(pin, executable_sha256), hashlib.sha256).hexdigest()


def verification_keys() -> "list[bytes]":
    """Every key of this user's that may have signed a pin (:func:`key_paths` that exist).

    Raises:
      UntrustedPin: none exists, or one is not this user's or others can read it.
    """
    existing = [p for p in key_paths() if os.path.lexists(p)]
    if not existing:
        raise UntrustedPin("no pin key at %s: your jaxfit signed no pin" % " or ".join(key_paths()))
    return [_read_key(p) for p in existing]


def signing_key_path(pin_path: str) -> Optional[str]:
    """The key file of this user's that signed the pin at ``pin_path`` (checked against the
    executable's SHA-256 it records), or None: unreadable, unsigned or signed with none of them."""
    try:
        with open(pin_path) as f:
            pin = json.load(f)
        message = _message(pin, str(pin.get("executable_sha256") or ""))
        signature = str(pin.get(SIGNATURE_FIELD) or "")
        for path in key_paths():
            if os.path.lexists(path):
                digest = hmac.new(_read_key(path), message, hashlib.sha256).hexdigest()
                if signature and hmac.compare_digest(digest, signature):
                    return path
    except (OSError, ValueError, UntrustedPin, AttributeError):
        pass
    return None


def check_files(pin_path: str) -> None:
    """Refuse a pin whose folder or files another user owns or others can write.

    Raises:
      UntrustedPin: why.
    """
    folder = os.path.dirname(os.path.abspath(pin_path))
    for path, what in ((folder, "the pin's folder"), (pin_path, "the pin")):
        st = os.lstat(path)
        _own(st, what, path)
        if st.st_mode & 0o022:
            raise UntrustedPin("%s %s can be written by others (mode %o)" % (what, path, stat.S_IMODE(st.st_mode)))
        if what == "the pin" and stat.S_ISLNK(st.st_mode):
            raise UntrustedPin("the pin %s is a link" % path)


def verify(pin: Dict[str, Any], pin_path: str, payload: bytes) -> None:
    """Refuse ``payload`` (the executable's bytes, read once) unless ``pin`` is this user's own: its
    files private to this user and its signature made with this user's key over these bytes.

    Raises:
      UntrustedPin: why, in words.
    """
    check_files(pin_path)
    signature = pin.get(SIGNATURE_FIELD)
    if not isinstance(signature, str) or not signature:
        raise UntrustedPin("the pin %s carries no signature (written by another jaxfit, or not by jaxfit)" % pin_path)
    message = _message(pin, hashlib.sha256(payload).hexdigest())
    if not any(
        hmac.compare_digest(hmac.new(key, message, hashlib.sha256).hexdigest(), signature)
        for key in verification_keys()
    ):
        raise UntrustedPin(
            "the pin %s was not signed with your pin key (%s): not written by your jaxfit, or changed since"
            % (pin_path, key_path())
        )


def problem(pin: Dict[str, Any], pin_path: str) -> Optional[str]:
    """Why the pin at ``pin_path`` must not be used at all (None: it is this user's own and signed,
    or its executable is not the one its ``pin.json`` describes: a damaged pin, which is never
    loaded, so the step compiles as usual and is checked against the budget)."""
    try:
        folder = os.path.dirname(os.path.abspath(pin_path))
        with open(os.path.join(folder, str(pin.get("executable") or "executable.bin")), "rb") as f:
            payload = f.read()
        recorded = pin.get("executable_sha256")
        if len(payload) != pin.get("executable_bytes") or (
            recorded and hashlib.sha256(payload).hexdigest() != recorded
        ):
            check_files(pin_path)
            return None  # damaged: not loaded (jaxfit_pin checks it whole before anything else)
        verify(pin, pin_path, payload)
    except UntrustedPin as e:
        return str(e)
    except OSError as e:
        return "its executable cannot be read (%s)" % (e.strerror or e)
    return None
