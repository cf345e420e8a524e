"""Who the runner's operators are, and how their accounts reach its socket.

`GOALTENDER_OPERATORS` names accounts (`ana`, a uid `1001`) and groups (`@goaltender-ops`, a gid
`@1002`: every member is an operator); empty means the runner's own user. Two gates, both needed:

- **The kernel's**: the socket and the directories above it must let the account connect. The
  runner's home is 0700 and the socket 0600, so for anyone but its own user the runner adds POSIX
  ACL entries (`u:ana:--x` on the directories, `u:ana:rw-` on the socket; `g:…` for groups).
  ACLs and not a shared group with g+x modes: they name individual accounts as well as groups,
  need no group set up by root nor the runner's user in it, and grant only *search* on the
  directories (no listing), leaving every mode as it was. The home and the socket get exactly the
  configured entries at each start (a removed operator loses its entry); a directory above the
  home that the runner's user owns (its own home, 0700 on Debian 12) gets the search entry added;
  one it does not own must already let the operator through, or the runner says which and how.
- **The runner's**: each connection's peer uid (SO_PEERCRED, runner/trust.py) must be a named
  account or a member of a named group at hello; anyone else is refused and audited.

The ACLs are written as the kernel's `system.posix_acl_access` extended attribute
(linux/posix_acl_xattr.h: a version word, then sorted tag/permission/id entries), which needs no
library or `setfacl` on the box; the layout has been stable since Linux 2.6.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from goaltender.runner.config import ConfigError

log = logging.getLogger("goaltender.runner")

ACL_XATTR = "system.posix_acl_access"
ACL_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
UNDEFINED_ID = 0xFFFFFFFF
R, W, X = 4, 2, 1
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")


@dataclass(frozen=True)
class Operators:
    """The uids and gids GOALTENDER_OPERATORS names (default: the runner's own uid)."""

    uids: frozenset[int]
    gids: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def parse(cls, entries: list[int | str]) -> Operators:
        """Names looked up now, so a typo stops the runner at start, saying which name."""
        uids, gids = set(), set()
        for entry in entries:
            text = str(entry).strip()
            if text.startswith("@"):
                gids.add(_group_id(text[1:]))
            else:
                uids.add(_user_id(text))
        if not uids and not gids:
            uids.add(os.getuid())
        return cls(frozenset(uids), frozenset(gids))

    def admits(self, uid: int | None) -> bool:
        """Is `uid` an operator: named, or in a named group (as the account database says now)?"""
        if uid is None:
            return False
        return uid in self.uids or (bool(self.gids) and bool(self.gids & groups_of(uid)))

    def others(self) -> tuple[frozenset[int], frozenset[int]]:
        """The uids (other than the runner's own) and gids that need the kernel's leave."""
        return self.uids - {os.getuid()}, self.gids

    def describe(self) -> str:
        users = [f"uid {uid} ({user_name(uid)})" for uid in sorted(self.uids)]
        groups = [f"group @{group_name(gid)} (gid {gid})" for gid in sorted(self.gids)]
        return ", ".join(users + groups)


def _user_id(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        hint = f" (a group is written @{text})" if _is_group(text) else ""
        raise ConfigError(
            f"GOALTENDER_OPERATORS: there is no user named {text!r} on this machine{hint}"
        ) from None


def _group_id(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise ConfigError(f"GOALTENDER_OPERATORS: there is no group named {text!r} on this machine") from None


def _is_group(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def user_name(uid: int | None) -> str:
    if uid is None:
        return "unknown user"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def groups_of(uid: int) -> frozenset[int]:
    """The groups the account database puts `uid` in (its primary group too); none for no account."""
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    return frozenset(os.getgrouplist(account.pw_name, account.pw_gid))


# ---- the kernel's gate: POSIX ACLs ----


Entries = dict[tuple[int, int], int]  # (tag, id) -> permission bits


def read_acl(path: Path) -> Entries:
    """`path`'s access ACL; without one, the three entries its mode stands for."""
    try:
        raw = os.getxattr(path, ACL_XATTR, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
        mode = os.lstat(path).st_mode
        return {(USER_OBJ, UNDEFINED_ID): (mode >> 6) & 7, (GROUP_OBJ, UNDEFINED_ID): (mode >> 3) & 7,
                (OTHER, UNDEFINED_ID): mode & 7}  # fmt: skip
    entries: Entries = {}
    for offset in range(_HEADER.size, len(raw), _ENTRY.size):
        tag, perm, ident = _ENTRY.unpack_from(raw, offset)
        entries[(tag, ident)] = perm
    return entries


def write_acl(path: Path, entries: Entries) -> None:
    """Set `path`'s access ACL to `entries`, the mask made to cover the named ones."""
    entries = {key: perm for key, perm in entries.items() if key[0] != MASK}
    if any(tag in (USER, GROUP) for tag, _ in entries):
        group_class = [perm for (tag, _), perm in entries.items() if tag in (USER, GROUP, GROUP_OBJ)]
        entries[(MASK, UNDEFINED_ID)] = _union(group_class)
    blob = _HEADER.pack(ACL_VERSION) + b"".join(
        _ENTRY.pack(tag, perm, ident) for (tag, ident), perm in sorted(entries.items())
    )
    os.setxattr(path, ACL_XATTR, blob, follow_symlinks=False)


def _union(perms: list[int]) -> int:
    result = 0
    for perm in perms:
        result |= perm
    return result


def _named(uids: frozenset[int], gids: frozenset[int], perm: int) -> Entries:
    return {(USER, uid): perm for uid in uids} | {(GROUP, gid): perm for gid in gids}


def _exactly(path: Path, uids: frozenset[int], gids: frozenset[int], perm: int) -> None:
    """`path`'s ACL: its mode's entries and these named ones, no others (a removed operator's go)."""
    entries = {key: p for key, p in read_acl(path).items() if key[0] not in (USER, GROUP, MASK)}
    write_acl(path, entries | _named(uids, gids, perm))


def _adding(path: Path, uids: frozenset[int], gids: frozenset[int], perm: int) -> None:
    """Add these named entries to `path`'s ACL (a directory the runner shares with its user)."""
    entries = read_acl(path)
    for key, granted in _named(uids, gids, perm).items():
        entries[key] = entries.get(key, 0) | granted
    write_acl(path, entries)


def may_search(path: Path, uid: int | None, gid: int | None) -> bool:
    """Can the account `uid` (or any member of group `gid`) pass through directory `path`?"""
    info = os.stat(path)
    acl = read_acl(path)
    mask = acl.get((MASK, UNDEFINED_ID), 7)
    if uid is not None:
        if info.st_uid == uid:
            return bool(info.st_mode & stat.S_IXUSR)
        if (USER, uid) in acl:
            return bool(acl[(USER, uid)] & mask & X)
        groups = groups_of(uid)
    else:
        groups = frozenset({gid}) if gid is not None else frozenset()
    granted = [acl[(GROUP, g)] for g in groups if (GROUP, g) in acl]
    if info.st_gid in groups:
        granted.append(acl.get((GROUP_OBJ, UNDEFINED_ID), (info.st_mode >> 3) & 7))
    if granted:  # a matching group decides, as the kernel does: "other" is not asked then
        return bool(_union(granted) & mask & X)
    return bool(info.st_mode & stat.S_IXOTH)


def open_socket_to(operators: Operators, socket_path: Path, home: Path) -> None:
    """Let the operators other than the runner's user reach `socket_path` (just bound, 0600): ACL
    entries on it and on the directories above it, as the module docstring says. Raises ConfigError
    saying which directory keeps whom out, or that the filesystem has no ACLs."""
    uids, gids = operators.others()
    if not uids and not gids:
        _forget(home)  # operators named before lose their way in
        return
    try:
        _grant(uids, gids, socket_path, home)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise ConfigError(
                f"GOALTENDER_OPERATORS names other accounts, but the filesystem of {exc.filename or socket_path} "
                "has no POSIX ACLs to let them reach the socket: mount it with ACLs (`acl` option), "
                "or set GOALTENDER_SOCKET to a path on one that has them (ext4, xfs, btrfs, tmpfs)"
            ) from None
        raise


def _forget(directory: Path) -> None:
    """Drop `directory`'s ACL, if it has one: its mode alone says who may pass."""
    try:
        os.removexattr(directory, ACL_XATTR)
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.ENOENT):
            raise


def _grant(uids: frozenset[int], gids: frozenset[int], socket_path: Path, home: Path) -> None:
    me = os.getuid()
    home = home.resolve()  # the directories the kernel walks, not a symlink's name for them
    parent = socket_path.parent.resolve()
    for directory in [parent, *parent.parents]:
        if _is_under(directory, home):  # the runner's own, made private: exactly these entries
            _exactly(directory, uids, gids, X)
            continue
        users = frozenset(uid for uid in uids if not may_search(directory, uid, None))
        groups = frozenset(gid for gid in gids if not may_search(directory, None, gid))
        if not users and not groups:
            continue
        who = [f"user {_account(uid)}" for uid in sorted(users)] + [
            f"group @{group_name(g)}" for g in sorted(groups)
        ]
        owner = os.stat(directory).st_uid
        if owner == me:
            _adding(directory, users, groups, X)
            log.info("let %s pass through %s (search only: an ACL entry)", ", ".join(who), directory)
            continue
        entry = f"u:{_account(min(users))}" if users else f"g:{group_name(min(groups))}"
        raise ConfigError(
            f"GOALTENDER_OPERATORS: {who[0]} cannot pass through {directory} to the runner socket "
            f"{socket_path}, and it is not the runner user's to open (owner {_account(owner)}): "
            f"as its owner, `setfacl -m {entry}:x {directory}` (or chmod o+x), or set "
            "GOALTENDER_SOCKET to a path they can reach"
        )
    _exactly(parent / socket_path.name, uids, gids, R | W)


def _account(uid: int) -> str:
    """The account's name, or its uid when it has none (setfacl takes either)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _is_under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents
