"""This process's and this host's memory, as psutil reads it (bytes): one place for the reads
that the memory records, the budget, the trials, the fake GPU host and the diagnosis share."""
import psutil


def rss_bytes() -> int:
    """Resident set size of this process."""
    return int(psutil.Process().memory_info().rss)


def address_space_bytes() -> int:
    """Virtual size of this process (``VmSize``, what ``RLIMIT_AS`` bounds)."""
    return int(psutil.Process().memory_info().vms)


def host_memory_bytes() -> int:
    """This host's physical memory."""
    return int(psutil.virtual_memory().total)
