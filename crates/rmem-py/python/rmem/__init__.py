"""rmem: numpy arrays whose data lives in remote memory (the RAM of memory servers).

Arrays made by :func:`empty`, :func:`zeros`, :func:`full`, :func:`array` and
:func:`fromfile` are ordinary :class:`numpy.ndarray` objects; only their data is in rmem's
region, paged in and out by rmem's pager within a local memory budget. Every numpy
operation works on them. Results of operations (``a + b``, ``a.sum(axis=0)``) are ordinary
local arrays: pass ``out=`` an rmem array to keep a large result remote. Freeing the last
array that uses a block of remote memory gives its pages back to the servers.

Usage::

    import numpy as np, rmem

    with rmem.connect(local="1G"):          # starts two local memory servers
        a = rmem.zeros((1 << 28,), np.float64)   # 2 GiB, twice the budget
        a[:] = 1.0
        print(a.sum(), rmem.stats()["swap_ins"])

The first allocation connects with the defaults when :func:`connect` was not called.

:class:`Region` is the other interface: a region of bytes on the same servers, read and
written by byte range with no mapping and no local cache (docs/regions.md), and shared with
other processes by name.
"""

from __future__ import annotations

import json
import operator
import os
import threading
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from . import _rmem
from ._rmem import RmemError, ServerLost

__all__ = [
    "RmemError",
    "ServerLost",
    "Connection",
    "connect",
    "close",
    "connected",
    "empty",
    "zeros",
    "full",
    "array",
    "fromfile",
    "stats",
    "is_remote",
    "Region",
]

Size = Union[int, str]
Shape = Union[int, Sequence[int]]

_lock = threading.Lock()


class Connection:
    """The connection :func:`connect` opened; leaving a ``with`` block closes it."""

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        close()

    def close(self) -> None:
        """Same as :func:`rmem.close`."""
        close()

    def __repr__(self) -> str:
        if not _rmem._connected():
            return "<rmem.Connection closed>"
        i = _rmem._info()
        return (
            f"<rmem.Connection servers={i['servers']!r} local={i['local_bytes']} "
            f"page_size={i['page_size']}>"
        )


def connect(
    servers: Optional[Union[str, Iterable[str]]] = None,
    local: Optional[Size] = None,
    page_size: Optional[Size] = None,
    hostfile: Optional[Union[str, "os.PathLike[str]"]] = None,
    manager: Optional[str] = None,
    redundancy: Optional[str] = None,
    encrypt: Optional[bool] = None,
) -> Connection:
    """Start rmem in this process.

    Where the memory servers come from, first match wins:

    * ``manager``: a memory pool's manager, ``"host:port"`` (``rmem manager``): the pool's
      servers, placed by free memory, and servers that join later; the token comes from
      ``RMEM_TOKEN`` or ``RMEM_TOKEN_FILE`` (docs/pool.md);
    * ``servers``: running servers, ``"host:port,host:port"`` or a list of ``"host:port"``;
      the token comes from ``RMEM_TOKEN`` or ``RMEM_TOKEN_FILE``;
    * ``hostfile``: a DLM hosts file; its servers are started (``rmem launch``) and finalized
      when this connection ends;
    * the environment ``rmem run`` sets (``rmem run -- python3 script.py``);
    * otherwise servers started here, finalized with the connection: those of the hosts file
      ``RMEM_HOSTFILE`` or ``./dlm_hosts`` names, else two on 127.0.0.1. The ``rmem`` binary
      is ``RMEM_BIN``, else ``rmem`` on the ``PATH``.

    ``local`` is the local memory budget (bytes of remote arrays resident at once) and
    ``page_size`` the unit of paging, as ints or strings such as ``"1G"``, ``"64K"``. Left
    out, they are ``RMEM_LOCAL`` / ``RMEM_PAGE_SIZE`` when set (``rmem run --local`` sets
    the first), else the hosts file's budget, else 1G and 64K. Every other setting comes from
    the ``RMEM_*`` environment (docs/configuration.md).

    ``redundancy`` is how each page is kept across the servers, as ``rmem run --redundancy``:
    ``"none"``, ``"replicas:N"``, ``"ec:K+M"`` or ``"auto"`` (a bad one raises
    :class:`ValueError`; one wider than the servers, :class:`RmemError`); ``encrypt`` is
    ``True`` or ``False`` (left out: on whenever a server is off loopback). Left out, both come
    from ``RMEM_REDUNDANCY`` / ``RMEM_ENCRYPT``, else the hosts file's lines, else the
    defaults (docs/configuration.md).

    Raises :class:`RmemError` when already connected, or when no servers can be started or
    reached. The connection is a context manager; :func:`close` ends it.
    """
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s.strip()]
    elif servers is not None:
        servers = [str(s) for s in servers]
    with _lock:
        _rmem._connect(
            servers=servers,
            local=local,
            page_size=page_size,
            hostfile=None if hostfile is None else os.fspath(hostfile),
            redundancy=redundancy,
            encrypt=encrypt,
            manager=manager,
        )
    return Connection()


def close() -> None:
    """End the connection. Arrays still alive keep working: the runtime (and the servers it
    started) stop when the last of them is freed. A later :func:`connect` starts a new one.
    Does nothing when not connected."""
    with _lock:
        _rmem._close()


def connected() -> bool:
    """Whether :func:`connect` was called (explicitly or by a first allocation) and not
    closed."""
    return _rmem._connected()


def _ensure() -> None:
    if not _rmem._connected():
        with _lock:
            if not _rmem._connected():
                _rmem._connect()


def _shape(shape: Shape) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    return shape


def _alloc_array(shape: Shape, dtype: Any, order: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(
            "rmem arrays hold plain data; dtype=object (references to Python objects) is not "
            "supported"
        )
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', not {order!r}")
    shp = _shape(shape)
    nbytes = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
    _ensure()
    block = _rmem._alloc(nbytes)
    # The uint8 view's base is the block, and the array's base that view: the block is freed
    # when the last array or view of it goes.
    raw = np.asarray(block)
    return np.ndarray(shp, dtype=dt, buffer=raw, order=order)


def empty(shape: Shape, dtype: Any = float, order: str = "C") -> np.ndarray:
    """A new array in remote memory, as :func:`numpy.empty`. Its contents are zero (fresh
    remote memory reads as zero and costs nothing until written)."""
    return _alloc_array(shape, dtype, order)


def zeros(shape: Shape, dtype: Any = float, order: str = "C") -> np.ndarray:
    """A new array of zeros in remote memory, as :func:`numpy.zeros`."""
    return _alloc_array(shape, dtype, order)


def full(shape: Shape, fill_value: Any, dtype: Any = None, order: str = "C") -> np.ndarray:
    """A new array in remote memory filled with ``fill_value``, as :func:`numpy.full`."""
    if dtype is None:
        dtype = np.array(fill_value).dtype
    a = _alloc_array(shape, dtype, order)
    a.fill(fill_value)
    return a


def array(obj: Any, dtype: Any = None, order: str = "C") -> np.ndarray:
    """A copy of ``obj`` (an array or anything :func:`numpy.asarray` takes) in remote
    memory."""
    src = np.asarray(obj, dtype=dtype)
    dst = _alloc_array(src.shape, src.dtype, order)
    np.copyto(dst, src)
    return dst


def fromfile(
    path: Union[str, "os.PathLike[str]"],
    dtype: Any = float,
    count: int = -1,
    offset: int = 0,
) -> np.ndarray:
    """Read a binary file into a new 1-D remote array, as :func:`numpy.fromfile` (without
    ``sep``): ``count`` items (-1: up to the end of the file) of ``dtype`` from byte
    ``offset``. The file may be far larger than the local budget. Raises :class:`OSError`
    when the file cannot be read, :class:`ValueError` when it is shorter than ``count``
    items."""
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError("rmem.fromfile reads plain data; dtype=object is not supported")
    path = os.fspath(path)
    available = max(os.path.getsize(path) - offset, 0) // dt.itemsize
    n = available if count < 0 else int(count)
    if n > available:
        raise ValueError(f"{path}: {available} items of {dt} from byte {offset}, not {n}")
    _ensure()
    block = _rmem._alloc(n * dt.itemsize)
    got = _rmem._read_into(path, block, offset, n * dt.itemsize)
    if got != n * dt.itemsize:
        raise OSError(f"{path}: read {got} of {n * dt.itemsize} bytes (file truncated?)")
    return np.ndarray((n,), dtype=dt, buffer=np.asarray(block))


def stats() -> Dict[str, Any]:
    """The runtime's statistics: the fields of ``rmem run``'s JSON report (``swap_ins``,
    ``swap_outs``, ``faults``, ``bytes_fetched``, ...) and ``servers``, ``page_size``,
    ``local_bytes``, ``capacity_bytes``, ``allocated_bytes`` (remote memory held by live
    arrays), ``live_arrays`` and ``userfaultfd`` (the mode). Raises :class:`RmemError` when
    not connected, :class:`ServerLost` after a lost server."""
    d: Dict[str, Any] = json.loads(_rmem._stats_json())
    d.update(_rmem._info())
    return d


def is_remote(a: np.ndarray) -> bool:
    """Whether the data of ``a`` (an array or a view) lives in an rmem block."""
    base: Any = a
    while base is not None:
        if isinstance(base, _rmem.Block):
            return True
        base = getattr(base, "base", None)
    return False


def _c_contiguous(obj: Any, what: str, writable: bool) -> Tuple[memoryview, int]:
    """A buffer-protocol object as a memoryview and its byte count; raises ``TypeError`` for
    an object without the buffer protocol (or read-only when ``writable``)."""
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{what} must support the buffer protocol (bytes, bytearray, memoryview, a numpy "
            f"array...), not {type(obj).__name__}"
        ) from None
    if writable and mv.readonly:
        raise TypeError(f"{what} is read-only: readinto needs a writable buffer")
    return mv, mv.nbytes


def _range(offset: Any, length: Any) -> Tuple[int, int]:
    """Offsets and lengths as ints; a negative one is a bad range (``ValueError``), as one
    past the end is."""
    offset, length = operator.index(offset), operator.index(length)
    if offset < 0 or length < 0 or offset + length >= 1 << 64:
        raise ValueError(f"range of {length} bytes at offset {offset} is outside any region")
    return offset, length


class Region:
    """A region of bytes on the memory servers, read and written by byte range.

    Nothing is mapped or cached locally: :meth:`read` of 100 bytes moves about 100 bytes,
    not a page (see :meth:`stats`), and the servers hold what :meth:`write` wrote. Bytes
    never written read as zeros. The calls release the GIL while the bytes travel, and are
    safe from any number of threads (writes of the same bytes at once land in no particular
    order). Use and limits: docs/regions.md.

    ``Region(size, name=None)`` makes a region of ``size`` bytes (an int, or a string such
    as ``"64M"``) on the servers of this process's session, connecting with the defaults
    first when :func:`connect` was not called. Under the plain layout (no ``redundancy``, no
    ``encrypt``) each piece of a range is a byte-range request; under any other layout, or
    in a pool, whole pages (or 4 KiB pieces) are read, changed and stored again sealed, with
    paged memory's failover and repair. With a ``name`` (1 to 64 of ``[A-Za-z0-9._-]``, not
    starting with ``.``) other processes of the same user can :meth:`open` it while this one
    holds it (under a layout other than the plain one, this process serves their calls: it
    alone can read the pages). :meth:`close` (or leaving a ``with`` block, or
    the object being freed) ends the region, for every process that opened it when this
    process made it. The session's servers stay up while a region on them is open, even
    after :func:`close`.

    Errors: a range outside the region or a bad name raises :class:`ValueError` before
    anything moves; every other failure raises :class:`OSError` with the ``errno`` the C
    API sets (``ENOENT`` no such name: :class:`FileNotFoundError`; ``EEXIST`` name taken:
    :class:`FileExistsError`; ``ENOSPC`` a server is full; ``EIO`` a server lost or the
    region ended by its creator: that call and every later one fail).

    A region cannot be used in a ``fork()`` child (it raises :class:`RmemError`): open it
    by name there.
    """

    __slots__ = ("_r", "name")

    def __init__(self, size: Size, name: Optional[str] = None) -> None:
        _ensure()
        self.name: Optional[str] = name
        self._r = _rmem._Region.create(size, name)

    @classmethod
    def open(cls, name: str) -> "Region":
        """The region another process of this user made as ``name`` and still holds. Needs
        no :func:`connect`: the region's registration names its servers. Raises
        :class:`FileNotFoundError` when there is no such region (or its creator is gone).
        :meth:`close` closes only this process's links to it."""
        r = cls.__new__(cls)
        r.name = name
        r._r = _rmem._Region.open(name)
        return r

    @property
    def size(self) -> int:
        """Bytes in the region."""
        return self._r.size

    @property
    def page_size(self) -> int:
        """A range is split at multiples of this: one request per piece."""
        return self._r.page_size

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._r.closed

    def __len__(self) -> int:
        return self._r.size

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``."""
        return self._r.read(*_range(offset, length))

    def readinto(self, offset: int, buffer: Any) -> int:
        """Fill ``buffer`` (any writable, C-contiguous buffer-protocol object: a
        ``bytearray``, a ``memoryview``, a numpy array of any dtype) with the bytes at
        ``offset``, as many as the buffer holds. The bytes go straight into the buffer's
        memory, with no copy in between. Returns the number of bytes read."""
        mv, n = _c_contiguous(buffer, "the buffer", writable=True)
        offset, n = _range(offset, n)
        if not mv.c_contiguous:
            raise BufferError("readinto needs a C-contiguous buffer (a numpy array: use "
                              "np.ascontiguousarray, then copy back)")
        if n == 0:
            self._r._read_at(offset, 0, 0)
            return 0
        # A uint8 view of the same memory: it holds a buffer export (the memory can neither
        # move nor go) while the native call writes to the address.
        view = np.frombuffer(mv, dtype=np.uint8)
        self._r._read_at(offset, view.__array_interface__["data"][0], n)
        return n

    def write(self, offset: int, data: Any) -> int:
        """Write ``data`` (``bytes`` or any buffer-protocol object) at ``offset``; returns
        the number of bytes written. A C-contiguous buffer is sent from where it is; another
        (a strided numpy view) is copied first, in C order."""
        if isinstance(data, bytes):
            self._r._write_bytes(_range(offset, 0)[0], data)
            return len(data)
        mv, n = _c_contiguous(data, "data", writable=False)
        offset, n = _range(offset, n)
        if not mv.c_contiguous:
            self._r._write_bytes(offset, mv.tobytes())
            return n
        if n == 0:
            self._r._write_at(offset, 0, 0)
            return 0
        view = np.frombuffer(mv, dtype=np.uint8)  # holds the export, as in readinto
        self._r._write_at(offset, view.__array_interface__["data"][0], n)
        return n

    def stats(self) -> Dict[str, int]:
        """What the region moved: ``reads``/``writes`` (calls), ``bytes_read``/
        ``bytes_written`` (as asked), ``bytes_fetched``/``bytes_sent`` (page data that came
        from and went to the servers, no headers), ``requests`` (one per piece of a range
        within a page), ``size``, ``page_size``."""
        return dict(self._r.stats())

    def close(self) -> None:
        """End the region (made here: for every process that opened it; opened here: this
        process's links). Calls in flight on other threads finish first. Idempotent."""
        self._r.close()

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._r.closed:
            return f"<rmem.Region name={self.name!r} closed>"
        return f"<rmem.Region name={self.name!r} size={self._r.size}>"
