#!/usr/bin/env python3
"""Unpacks .deb files into a folder (never into /), without dpkg.

  tools/gpu/unpack.py DEBS_DIR ROOT

A .deb is an ar archive holding data.tar.{xz,gz}; its files go under ROOT, and
none may land outside it (a member's path, or a link already unpacked on the
way there). Debian's -dev packages link libfoo.so to an absolute /lib/... or
/usr/lib/... path: such a link is pointed at the same file under ROOT when it
is there, or else at the library of the same soname that this machine has
(ldconfig), so that the compiler finds what the loader will load. ROOT/lacking
gets a link to each shared library this machine lacks, for LD_LIBRARY_PATH:
the machine's own libraries (OpenSSL, say) stay the ones its programs load.
ROOT/.unpacked marks an unpack that finished.
"""
import io
import os
import shutil
import subprocess
import sys
import tarfile


def ar_members(path):
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            sys.exit(f"unpack: {path} is not a .deb (no ar header)")
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def inside(root, path):
    return os.path.commonpath([root, path]) == root


def extract_member(tar, member, root):
    """As it is: the checks above are ours (Python 3.14's default filter
    would refuse the absolute links that mend_links points back inside)."""
    try:
        tar.extract(member, root, set_attrs=False, filter="fully_trusted")
    except TypeError:  # a Python without extraction filters
        tar.extract(member, root, set_attrs=False)


def extract(deb, root):
    for name, data in ar_members(deb):
        if not name.startswith("data.tar"):
            continue
        if name.endswith(".zst"):
            sys.exit(f"unpack: {deb} is zstd-compressed; use dpkg -x")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for member in tar.getmembers():
                if not (member.isfile() or member.isdir() or member.issym()):
                    continue  # no devices, fifos or hard links
                # Resolved through what is already unpacked (links included).
                target = os.path.join(os.path.realpath(
                    os.path.join(root, os.path.dirname(member.name))),
                    os.path.basename(member.name))
                if not inside(root, target):
                    sys.exit(f"unpack: {deb} holds {member.name}, outside the root")
                if os.path.lexists(target) and not os.path.isdir(target):
                    os.remove(target)
                extract_member(tar, member, root)
        return
    sys.exit(f"unpack: {deb} has no data.tar")


def host_libraries():
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p"], stdout=subprocess.PIPE, text=True).stdout
    found = {}
    for line in out.splitlines()[1:]:
        if "=>" in line and "x86-64" in line:
            name, path = line.split("=>")
            found.setdefault(name.split()[0], path.strip())
    if not found:  # else every unpacked library would shadow the machine's own
        sys.exit("unpack: ldconfig -p listed no libraries")
    return found


def mend_links(root):
    host = None
    for folder, dirs, files in os.walk(root):
        for name in files + dirs:
            link = os.path.join(folder, name)
            if not os.path.islink(link):
                continue
            target = os.readlink(link)
            if not os.path.isabs(target):
                continue
            inside = os.path.join(root, target.lstrip("/"))
            if not os.path.lexists(inside):  # merged /usr: /lib is /usr/lib
                inside = os.path.join(root, "usr", target.lstrip("/").removeprefix("usr/"))
            if os.path.lexists(inside):
                os.remove(link)
                os.symlink(os.path.relpath(inside, folder), link)
                continue
            if os.path.exists(target) or ".so" not in name:
                continue
            if host is None:
                host = host_libraries()
            soname = os.path.basename(target)
            while soname not in host and soname.count(".so."):
                soname = soname.rsplit(".", 1)[0]
            if soname in host:
                os.remove(link)
                os.symlink(host[soname], link)
            else:
                print(f"unpack: {link} -> {target}: neither under the root nor on this machine")


def link_lacking(root):
    """ROOT/lacking: the shared libraries of ROOT whose soname this machine lacks."""
    host = host_libraries()
    lacking = os.path.join(root, "lacking")
    os.makedirs(lacking, exist_ok=True)
    libdir = os.path.join(root, "usr", "lib", "x86_64-linux-gnu")
    # Every versioned name the machine does not know: a soname may carry one
    # number (libzmq.so.5) or two (libspdlog.so.1.10).
    for name in sorted(os.listdir(libdir)):
        path = os.path.join(libdir, name)
        if ".so." in name and name not in host and os.path.exists(path):
            os.symlink(path, os.path.join(lacking, name))
    return sorted(os.listdir(lacking))


def main():
    debs, root = sys.argv[1], os.path.realpath(sys.argv[2])
    if root == "/":
        sys.exit("unpack: not into /")
    if os.path.exists(root):
        shutil.rmtree(root)  # a half-finished unpack is not reused
    os.makedirs(root)
    names = sorted(n for n in os.listdir(debs) if n.endswith(".deb"))
    if not names:
        sys.exit(f"unpack: no .deb in {debs}: run tools/gpu/fetch.sh here and carry .gpu")
    for name in names:
        extract(os.path.join(debs, name), root)
    mend_links(root)
    lacking = link_lacking(root)
    open(os.path.join(root, ".unpacked"), "w").close()
    print(f"unpack: {len(names)} packages into {root}; this machine lacks {', '.join(lacking)}")


if __name__ == "__main__":
    main()
