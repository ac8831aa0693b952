"""Reading a PLY file's vertices: nerfstudio's `sparse_pc.ply` (the `transforms.json` loader) and the
point clouds `python -m pola_gnt.export` writes (the viewer shows them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pola_gnt.core.errors import UserError

PLY_TYPES = {
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8", "uchar": "u1", "uint8": "u1",
    "char": "i1", "int8": "i1", "ushort": "u2", "uint16": "u2", "short": "i2", "int16": "i2",
    "uint": "u4", "uint32": "u4", "int": "i4", "int32": "i4",
}  # fmt: skip


def read_ply_vertices(path: Path) -> dict[str, np.ndarray]:
    """The vertex element's properties of a PLY file, by name (ASCII as float64, binary in their own
    types), `x`, `y` and `z` among them (the vertex element first, no list properties among them)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror or err})") from None
    end = data.find(b"end_header\n")
    if not data.startswith(b"ply") or end < 0:
        raise UserError(f"{path}: not a PLY file")
    fmt, count, properties, element = "", 0, [], None
    for line in data[:end].decode("ascii", "replace").splitlines():
        words = line.split()
        if words[:1] == ["format"]:
            fmt = words[1]
        elif words[:1] == ["element"]:
            if element == "vertex":
                break  # the vertex element's properties are read; what follows is other elements'
            element, count = words[1], int(words[2])
        elif words[:1] == ["property"] and element == "vertex":
            if words[1] == "list" or words[1] not in PLY_TYPES:
                raise UserError(f"{path}: unsupported vertex property {' '.join(words[1:])!r}")
            properties.append((words[2], PLY_TYPES[words[1]]))
    names = [name for name, _ in properties]
    if element != "vertex" or not {"x", "y", "z"} <= set(names):
        raise UserError(f"{path}: no vertices with x, y, z")
    body = data[end + len(b"end_header\n") :]
    if fmt == "ascii":
        rows = [line.split()[: len(names)] for line in body.decode("ascii", "replace").splitlines()[:count]]
        values = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
        return {name: values[:, i] for i, name in enumerate(names)}
    if fmt in ("binary_little_endian", "binary_big_endian"):
        order = "<" if fmt == "binary_little_endian" else ">"
        dtype = np.dtype([(name, order + kind) for name, kind in properties])
        if len(body) < count * dtype.itemsize:
            raise UserError(f"{path}: truncated ({count} vertices announced)")
        vertices = np.frombuffer(body, dtype=dtype, count=count)
        return {name: vertices[name] for name in names}
    raise UserError(f"{path}: unknown PLY format {fmt!r}")
