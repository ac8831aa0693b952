"""Point clouds and meshes as files: binary little-endian PLY (points with colours and a confidence;
meshes with vertex colours) and Wavefront OBJ (vertex colours as the common `v x y z r g b` extension,
which MeshLab, CloudCompare and Blender read). Every file is written atomically (`core.files.write_atomic`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pola_gnt.core.files import write_atomic
from pola_gnt.data.ply import read_ply_vertices


@dataclass
class PointCloud:
    points: np.ndarray  # [n, 3] float32, the scene's normalised frame
    colours: np.ndarray  # [n, 3] uint8
    confidence: np.ndarray | None = None  # [n] float32 in [0, 1]

    def __len__(self) -> int:
        return len(self.points)


@dataclass
class Mesh:
    vertices: np.ndarray  # [v, 3] float32
    faces: np.ndarray  # [f, 3] int64, counter-clockwise seen from outside (the TSDF's free side)
    colours: np.ndarray  # [v, 3] uint8


def _header(lines: list[str]) -> bytes:
    return ("\n".join(["ply", "format binary_little_endian 1.0", *lines, "end_header"]) + "\n").encode()


def point_cloud_bytes(cloud: PointCloud) -> bytes:
    """A binary PLY of `cloud`: x y z (float), red green blue (uchar), and `confidence` (float) when known."""
    fields = [("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")]
    if cloud.confidence is not None:
        fields.append(("confidence", "<f4"))
    vertices = np.empty(len(cloud), dtype=np.dtype(fields))
    for i, axis in enumerate("xyz"):
        vertices[axis] = cloud.points[:, i]
    for i, channel in enumerate(("red", "green", "blue")):
        vertices[channel] = cloud.colours[:, i]
    lines = [f"element vertex {len(cloud)}", *(f"property float {axis}" for axis in "xyz")]
    lines += [f"property uchar {channel}" for channel in ("red", "green", "blue")]
    if cloud.confidence is not None:
        vertices["confidence"] = cloud.confidence
        lines.append("property float confidence")
    return _header(lines) + vertices.tobytes()


def write_point_cloud(path: Path, cloud: PointCloud) -> None:
    write_atomic(path, point_cloud_bytes(cloud))


def mesh_ply_bytes(mesh: Mesh) -> bytes:
    vertices = np.empty(len(mesh.vertices), dtype=np.dtype([("xyz", "<f4", 3), ("rgb", "u1", 3)]))
    vertices["xyz"], vertices["rgb"] = mesh.vertices, mesh.colours
    faces = np.empty(len(mesh.faces), dtype=np.dtype([("count", "u1"), ("indices", "<i4", 3)]))
    faces["count"], faces["indices"] = 3, mesh.faces
    lines = [f"element vertex {len(mesh.vertices)}", *(f"property float {axis}" for axis in "xyz")]
    lines += [f"property uchar {channel}" for channel in ("red", "green", "blue")]
    lines += [f"element face {len(mesh.faces)}", "property list uchar int vertex_indices"]
    return _header(lines) + vertices.tobytes() + faces.tobytes()


def mesh_obj_bytes(mesh: Mesh) -> bytes:
    colours = mesh.colours.astype(np.float64) / 255.0
    vertex_lines = [
        f"v {x:.6f} {y:.6f} {z:.6f} {r:.4f} {g:.4f} {b:.4f}" for (x, y, z), (r, g, b) in zip(mesh.vertices, colours)
    ]
    face_lines = [f"f {a} {b} {c}" for a, b, c in (mesh.faces + 1).tolist()]  # OBJ counts from 1
    return ("\n".join(["# pola_gnt export: TSDF mesh, vertex colours", *vertex_lines, *face_lines]) + "\n").encode()


def write_mesh(path: Path, mesh: Mesh) -> None:
    """`mesh` as PLY or OBJ, by `path`'s suffix."""
    write_atomic(path, mesh_obj_bytes(mesh) if path.suffix == ".obj" else mesh_ply_bytes(mesh))


def read_point_cloud(path: Path) -> PointCloud:
    """The vertices of a PLY file (ASCII or binary, the vertex element first, no list properties among
    them): positions, colours (grey where it has none) and `confidence` when it has one."""
    columns = read_ply_vertices(path)
    points = np.stack([columns[axis] for axis in "xyz"], axis=-1).astype(np.float32)
    if {"red", "green", "blue"} <= set(columns):
        colours = np.stack([columns[c] for c in ("red", "green", "blue")], axis=-1).astype(np.uint8)
    else:
        colours = np.full((len(points), 3), 160, dtype=np.uint8)
    confidence = columns["confidence"].astype(np.float32) if "confidence" in columns else None
    finite = np.all(np.isfinite(points), axis=-1)
    return PointCloud(points[finite], colours[finite], None if confidence is None else confidence[finite])
