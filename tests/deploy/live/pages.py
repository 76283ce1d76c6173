"""Which physical pages a process maps at an address: the proof that two processes in
different containers share one tensor's memory rather than copies of it.

/proc/PID/maps names the file behind a mapping (a memfd: `/memfd:NAME (deleted)`, with its
device and inode), and /proc/PID/pagemap gives the page frame number of each present page.
Frame numbers are shown only to a reader with CAP_SYS_ADMIN (root on the host), and only for
pages the process has touched; the holders read every byte first.
"""

import struct

PAGE = 4096
_PRESENT = 1 << 63
_PFN_MASK = (1 << 55) - 1


class Mapping:
    def __init__(self, start, end, offset, device, inode, path):
        self.start, self.end, self.offset = start, end, offset
        self.device, self.inode, self.path = device, inode, path

    def __str__(self):
        return (f"{self.start:x}-{self.end:x} offset {self.offset:#x} dev {self.device} "
                f"inode {self.inode} {self.path}")


def mapping_at(pid, address):
    """The /proc/PID/maps entry that contains address."""
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                path = fields[5].strip() if len(fields) > 5 else ""
                return Mapping(start, end, int(fields[2], 16), fields[3], int(fields[4]), path)
    raise LookupError(f"pid {pid} maps nothing at {address:#x}")


def frames(pid, address, nbytes):
    """The page frame number of each page of [address, address + nbytes), None where the
    page is not present. Raises PermissionError when frame numbers are hidden (all zero)."""
    first = address // PAGE
    count = (address + nbytes + PAGE - 1) // PAGE - first
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        raw = pagemap.read(count * 8)
    entries = struct.unpack(f"<{count}Q", raw)
    result = [(e & _PFN_MASK) if e & _PRESENT else None for e in entries]
    if any(e & _PRESENT for e in entries) and not any(result):
        raise PermissionError(f"/proc/{pid}/pagemap hides frame numbers: run as root")
    return result
