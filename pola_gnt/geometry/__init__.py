"""Geometry, the bottom layer: cameras and poses (`cameras`), pixel rays (`rays`), projection into
source views and relative directions (`projection`), and fly-through camera paths (`camera_paths`).
Imports nothing else of `pola_gnt`."""
