"""``grpo-monitor compose-init``: the compose stack's one-shot set-up.

What docker-compose.yml's ``init`` service does before the stack starts, so that ``docker
compose up`` needs no preparation.

1. Secrets, each in its own named volume, created when missing and never replaced: the
   webhook's bearer token (read by the exporter and by Alertmanager) and Grafana's admin
   password (read through ``GF_SECURITY_ADMIN_PASSWORD__FILE``). Each file belongs to the one
   uid that reads it (and the reading group), mode 0440.
2. The snapshot folder: the exporter runs as uid 10001 and must write a red card's pause record
   ``<run>/.grpo-control.json`` into run folders that the trainer's user creates with the
   default umask 022 (0755: nobody else may write). A default POSIX ACL on the snapshot folder
   gives uid 10001 write access to every run folder created in it from now on (the kernel copies
   a folder's default ACL onto the folders created in it, whatever the creator's umask), and an
   access ACL does the same for the run folders already there. Nothing else changes: the owner
   stays the owner, the owning group and everyone else keep what the umask gave them, and the
   trainer needs no setting (docs/pause.md, "Permissions"). A folder the engine has just created
   for a missing bind-mount source (root's, empty) is handed to GRPO_UID:GRPO_GID first.

Runs as root in its container (it changes owners and ACLs); it prints what it did and where the
Grafana password is, and exits.
"""

from __future__ import annotations

import argparse
import errno
import os
import secrets
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

EXPORTER_UID = 10001  # exporter/Dockerfile's USER

# Linux's POSIX ACL extended attributes (include/uapi/linux/posix_acl_xattr.h): a version word,
# then (tag, permissions, id) entries sorted by tag, then id.
ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_RWX = 7

Acl = dict[tuple[int, int], int]  # (tag, id) -> permission bits


def _acl_from_mode(mode: int) -> Acl:
    return {(_USER_OBJ, _NO_ID): (mode >> 6) & 7, (_GROUP_OBJ, _NO_ID): (mode >> 3) & 7,
            (_OTHER, _NO_ID): mode & 7}


def _decode(raw: bytes) -> Acl:
    (version,) = _HEADER.unpack_from(raw)
    if version != _ACL_VERSION:
        raise ValueError(f"unknown POSIX ACL version {version}")
    return {(tag, eid): perm for tag, perm, eid in _ENTRY.iter_unpack(raw[_HEADER.size:])}


def _encode(acl: Acl) -> bytes:
    return _HEADER.pack(_ACL_VERSION) + b"".join(
        _ENTRY.pack(tag, perm, eid) for (tag, eid), perm in sorted(acl.items()))


def _read_acl(path: Path, name: str, fallback_mode: int) -> Acl:
    try:
        return _decode(os.getxattr(path, name))
    except OSError as exc:
        if exc.errno != errno.ENODATA:
            raise
        return _acl_from_mode(fallback_mode)  # no ACL yet: the mode bits are the whole ACL


def _with_user(acl: Acl, uid: int) -> Acl:
    """``acl`` plus rwx for ``uid``; the mask becomes the union of the group class, so that no
    existing entry loses a permission."""
    out = {k: v for k, v in acl.items() if k[0] != _MASK}
    out[(_USER, uid)] = _RWX
    mask = 0
    for (tag, _), perm in out.items():
        if tag in (_USER, _GROUP_OBJ, _GROUP):
            mask |= perm
    out[(_MASK, _NO_ID)] = mask
    return out


def grant_folder(path: Path, uid: int, *, inherit: bool, access: bool) -> None:
    """Give ``uid`` rwx on ``path`` (access ACL) and/or on what is created in it (default ACL)."""
    mode = path.stat().st_mode & 0o777
    if access:
        os.setxattr(path, ACL_ACCESS, _encode(_with_user(_read_acl(path, ACL_ACCESS, mode), uid)))
    if inherit:
        # The default ACL starts from the folder's own mode bits (0755 for a umask-022 folder),
        # so what it gives everyone else equals what umask 022 would.
        os.setxattr(path, ACL_DEFAULT, _encode(_with_user(_read_acl(path, ACL_DEFAULT, mode), uid)))


def user_has_acl(path: Path, uid: int, name: str = ACL_ACCESS) -> bool:
    try:
        acl = _decode(os.getxattr(path, name))
    except OSError:
        return False
    return acl.get((_USER, uid), 0) & _RWX == _RWX and acl.get((_MASK, _NO_ID), 0) & _RWX == _RWX


@dataclass(frozen=True)
class Secret:
    path: Path
    uid: int
    gid: int
    what: str


def ensure_secret(secret: Secret, nbytes: int = 24) -> bool:
    """Create the secret when missing or empty; fix its owner and mode. True if created."""
    created = False
    try:
        present = bool(secret.path.read_text().strip())
    except FileNotFoundError:
        present = False
    if not present:
        secret.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = secret.path.with_name(f".{secret.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(nbytes) + "\n")
        os.replace(tmp, secret.path)
        created = True
    os.chown(secret.path, secret.uid, secret.gid)
    os.chmod(secret.path, 0o440)
    return created


def prepare_snapshot_dir(snapshot_dir: Path, owner_uid: int, owner_gid: int,
                         exporter_uid: int = EXPORTER_UID) -> list[str]:
    """Hand an engine-made folder to the owner, and let the exporter write pause records in
    every run folder, present and future. Returns what it did, line by line."""
    notes: list[str] = []
    st = snapshot_dir.stat()
    if st.st_uid == 0 and owner_uid != 0 and not any(snapshot_dir.iterdir()):
        # Docker creates a missing bind-mount source as root: the trainer could not write there.
        os.chown(snapshot_dir, owner_uid, owner_gid)
        notes.append(f"{snapshot_dir}: empty and root's, handed to {owner_uid}:{owner_gid}")
    try:
        grant_folder(snapshot_dir, exporter_uid, inherit=True, access=False)
        runs = [p for p in sorted(snapshot_dir.iterdir())
                if p.is_dir() and not p.is_symlink() and p.stat().st_uid != exporter_uid]
        for run in runs:
            grant_folder(run, exporter_uid, inherit=True, access=True)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM, errno.EACCES):
            raise
        notes.append(
            f"WARNING: cannot set POSIX ACLs on {snapshot_dir} ({os.strerror(exc.errno)}): a red card "
            f"cannot pause runs whose folders uid {exporter_uid} may not write. Make the run folders "
            "writable for it (docs/pause.md, Permissions) or mount a filesystem with ACLs.")
        return notes
    notes.append(f"{snapshot_dir}: uid {exporter_uid} (the exporter) may write pause records in "
                 f"the {len(runs)} run folder(s) there and in every new one (default ACL)")
    return notes


def run(args: argparse.Namespace) -> int:
    """``grpo-monitor compose-init`` (its flags are in cli.py)."""
    if os.geteuid() != 0:
        print("grpo-monitor compose-init: run as root (docker-compose.yml's init service does)",
              file=sys.stderr)
        return 2
    try:
        owner_uid, owner_gid = (int(x) for x in str(args.owner).split(":", 1))
    except ValueError:
        print(f"grpo-monitor compose-init: --owner {args.owner!r} is not UID:GID", file=sys.stderr)
        return 2
    token = Secret(args.webhook_token, EXPORTER_UID, args.alertmanager_gid, "webhook token")
    password = Secret(args.grafana_password, args.grafana_uid, 0, "Grafana admin password")
    for secret in (token, password):
        state = "created" if ensure_secret(secret) else "kept"
        print(f"{secret.what}: {state} ({secret.path})", flush=True)
    print("Grafana: log in as admin with the password printed by\n"
          f"  docker compose exec grafana cat {args.grafana_password}", flush=True)
    snapshot_dir = args.snapshot_dir
    for line in prepare_snapshot_dir(snapshot_dir, owner_uid, owner_gid):
        print(line, flush=True)
    return 0
